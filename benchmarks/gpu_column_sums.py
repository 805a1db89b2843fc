"""A channels-last batch norm's statistics on the GPU: the column-sum kernel braze generates
for them, forms of it, and the whole op under eager, Inductor and braze, in one process.

    python benchmarks/gpu_column_sums.py
    python benchmarks/gpu_column_sums.py --shapes 32x64x112x112 --json sums.json

For each [N, C, H, W] f32 image stored channels-last, `torch.var_mean(x, (0, 2, 3))` is what a
train-mode batch norm computes. braze splits it (split-reductions): a first kernel sums x and
x*x in f64 over P partials of the N*H*W rows per channel, a column kernel; a second sums the
partials. The first kernel is timed alone, from the CUDA text `braze-opt --cuda` prints for
that graph (its prelude and function, compiled by NVRTC through torch.cuda._compile_kernel):
  - braze: as generated (plan-cuda's launch record);
  - braze_R{R}: as generated under a launch record of R column groups (`--launch`), where
    plan-cuda chose another R;
  - aligned_once: where braze tests its vector loads' alignment at every row (builds before
    the row loop tested it once), tested once per thread and the row loop unrolled 4 ways
    (`#pragma unroll 4`);
  - by_hand_R{R}_U{U}: a hand-written kernel of the same partials: R column groups of 4
    neighbouring channels a block (a warp reads 16 x R bytes of 32 / R rows), U rows in flight
    a thread, 32-bit indices.
Every form's partial sums are checked against float64 sums before it is timed. Then the whole
op: eager, Inductor (default mode) and braze (its own CUDA graphs off). Each contender runs as
a CUDA graph of 20 calls (no launch gaps between them); times are medians of --repeats samples,
contenders interleaved, in us per call.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

import torch

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--shapes", default="32x256x56x56,32x64x112x112",
               help="comma-separated NxCxHxW images (f32, channels-last)")
P.add_argument("--repeats", type=int, default=30)
P.add_argument("--json", help="write every time here")

HAND = r"""
extern "C" __global__ void __launch_bounds__(256) by_hand(const float* __restrict__ x,
    double* __restrict__ s1, double* __restrict__ s2, int* __restrict__ err) {
  constexpr int R = %(R)d, T = 256 / R, U = %(U)d, C = %(C)d, L = %(L)d;
  __shared__ double sm[8][R * 4][2];
  const int g = threadIdx.x %% R, lr = threadIdx.x / R;
  const int colBlocks = C / (R * 4);
  const int part = blockIdx.x / colBlocks, cb = blockIdx.x %% colBlocks;
  const float* p = x + (long long)part * L * C + cb * R * 4 + g * 4;
  double a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
  for (int r = lr; r < L; r += T * U) {
    float4 v[U];
    #pragma unroll
    for (int u = 0; u < U; ++u)
      v[u] = r + u * T < L ? *reinterpret_cast<const float4*>(p + (long long)(r + u * T) * C)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      const double e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
      #pragma unroll
      for (int j = 0; j < 4; ++j) { a[j] += e[j]; q[j] += e[j] * e[j]; }
    }
  }
  #pragma unroll
  for (int j = 0; j < 4; ++j)
    for (int o = 16; o >= R; o >>= 1) {
      a[j] += __shfl_xor_sync(0xffffffff, a[j], o);
      q[j] += __shfl_xor_sync(0xffffffff, q[j], o);
    }
  const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;
  if (lane < R)
    for (int j = 0; j < 4; ++j) {
      sm[warp][lane * 4 + j][0] = a[j];
      sm[warp][lane * 4 + j][1] = q[j];
    }
  __syncthreads();
  if (threadIdx.x < R * 4 * 2) {
    const int c = threadIdx.x / 2, w = threadIdx.x %% 2;
    double t = 0;
    for (int k = 0; k < 8; ++k) t += sm[k][c][w];
    (w ? s2 : s1)[part * C + cb * R * 4 + c] = t;
  }
}
"""


def braze_opt():
    import braze
    return os.path.join(os.path.dirname(braze.__file__), "bin", "braze-opt")


def var_mean_graph(n, c, h, w):
    """The graph of torch.var_mean(x, (0, 2, 3)) over an [n, c, h, w] f32 channels-last x."""
    return (f"graph(%x: f32[{n}, {c}, {h}, {w}]{{{h * w * c}, 1, {w * c}, {c}}}) {{\n"
            f"  %v = var(%x) {{correction=0.0, dims=[0, 2, 3], keepdim=false}} : f32[{c}]\n"
            f"  %m = mean(%x) {{dims=[0, 2, 3], keepdim=false}} : f32[{c}]\n"
            f"  return %v, %m\n}}\n")


def opt(text, *records):
    """braze-opt --cuda over `text` (a graph or a loop program), each of `records` (schedule
    lines) given as a --launch file: (schedule, code), or None where braze-opt refuses."""
    paths = []
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        paths.append(f.name)
        args = [braze_opt(), f.name, "--cuda"]
        for record in records:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as r:
                r.write(record)
            paths.append(r.name)
            args.append(f"--launch={r.name}")
        out = [subprocess.run(args + [f"--print={what}"], capture_output=True, text=True)
               for what in ("schedule", "code")]
        if any(o.returncode for o in out):
            return None
        return out[0].stdout, out[1].stdout
    finally:
        for path in paths:
            os.unlink(path)


def function_text(code, name):
    """The prelude of braze-opt's CUDA text `code` (what comes before its first kernel) and
    kernel `name`'s function."""
    at = code.rindex('extern "C"', 0, code.index(f") {name}("))
    return code[:code.index('extern "C"')], code[at:code.index("\n}\n", at) + 3]


def generated(n, c, h, w, columns=None):
    """braze's first kernel for the shape: (prelude, function text, name, blocks, partials,
    threads a block, column groups), under plan-cuda's record or one of `columns` groups."""
    graph = var_mean_graph(n, c, h, w)
    got = opt(graph)
    if got and columns:
        got = opt(graph, re.sub(r"launch\{[^}]*\}", f"launch{{block=256 threads={256 // columns} "
                                f"vec=4 columns={columns}}}", got[0].splitlines()[0]) + "\n")
    if got is None:
        raise SystemExit(f"braze-opt refused var_mean over [{n}, {c}, {h}, {w}]")
    schedule, code = got
    head = schedule.splitlines()[0]
    m = re.match(r"(kernel\d+) outer \[([^]]*)\].*launch\{block=(\d+) threads=(\d+) vec=(\d+) "
                 r"columns=(\d+)", head)
    if not m:
        raise SystemExit(f"not a column kernel first: {head}")
    name, outer = m.group(1), [int(e) for e in re.findall(r"< (\d+)", m.group(2))]
    block, vec, columns = int(m.group(3)), int(m.group(5)), int(m.group(6))
    points = 1
    for e in outer:
        points *= e
    prelude, body = function_text(code, name)
    if not re.search(r"\(const float\* __restrict__ (b\d+), double\* __restrict__ b\d+, "
                     r"double\* __restrict__ b\d+, int\* __restrict__ err\)", body):
        raise SystemExit(f"{name}: not (input, sum, sum of squares, err): {body[:200]}")
    return prelude, body, name, -(-points // (vec * columns)), points // c, block, columns


def aligned_once(body):
    """The alignment test of each vector load made once per thread from the input's base
    (every row's offset is a multiple of the vector), and the row loop unrolled 4 ways."""
    if "#pragma unroll 4" in body:
        return None
    src = re.search(r"\(const float\* __restrict__ (b\d+)", body).group(1)
    body = body.replace("  for (int64_t rb = ", "  #pragma unroll 4\n  for (int64_t rb = ")
    body = re.sub(r"if \(true && braze_aligned<4>\(vl\d+_p\)\)", "if (al)", body)
    return body.replace("  __shared__", f"  const bool al = braze_aligned<4>({src});\n"
                        "  __shared__", 1)


def graphed(f, calls=20):
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(calls):
            f()
    return g.replay, calls


def timed(fns, repeats):
    runs = {k: graphed(f) for k, f in fns.items()}
    for replay, _ in runs.values():
        replay()
    torch.cuda.synchronize()
    samples = {k: [] for k in runs}
    order = list(runs)
    for i in range(repeats):
        for k in order[i % len(order):] + order[:i % len(order)]:
            replay, calls = runs[k]
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            b.synchronize()
            samples[k].append(a.elapsed_time(b) * 1000 / calls)
    return {k: statistics.median(v) for k, v in samples.items()}


def main():
    args = P.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    import braze  # noqa: F401  (the backend)
    out = {}
    for shape in args.shapes.split(","):
        n, c, h, w = (int(v) for v in shape.split("x"))
        prelude, body, name, blocks, parts, block, planned = generated(n, c, h, w)
        rows = n * h * w // parts
        torch.manual_seed(0)
        x = torch.randn(n, c, h, w, device="cuda").to(memory_format=torch.channels_last)
        s1 = torch.empty(parts * c, dtype=torch.float64, device="cuda")
        s2 = torch.empty_like(s1)
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        rows_of = x.double().permute(0, 2, 3, 1).reshape(parts, rows, c)
        ref1, ref2 = rows_of.sum(1).reshape(-1), (rows_of ** 2).sum(1).reshape(-1)
        forms = {"braze": (body, name, blocks, block)}
        once = aligned_once(body)
        if once:
            forms["aligned_once"] = (once, name, blocks, block)
        for r in (2, 4):
            if r != planned and c % (4 * r) == 0:
                _, b, _, g, _, t, _ = generated(n, c, h, w, columns=r)
                forms[f"braze_R{r}"] = (b, name, g, t)
        for r in (2, 4):
            for u in (1, 2):
                if c % (4 * r) == 0:
                    forms[f"by_hand_R{r}_U{u}"] = (HAND % dict(R=r, U=u, C=c, L=rows), "by_hand",
                                                   parts * c // (4 * r), 256)
        fns = {}
        for form, (text, fn_name, grid, threads) in forms.items():
            k = torch.cuda._compile_kernel(prelude + "\n" + text, fn_name)
            call = (lambda k=k, grid=grid, threads=threads: k(grid=(grid, 1, 1),
                                                              block=(threads, 1, 1),
                                              args=[x, s1, s2, err]))
            s1.fill_(float("nan"))
            s2.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            if not (torch.allclose(s1, ref1, rtol=1e-9, atol=1e-6) and
                    torch.allclose(s2, ref2, rtol=1e-9, atol=1e-6)):
                raise SystemExit(f"{shape} {form}: partial sums differ from float64's")
            fns[form] = call
        op = lambda t: torch.var_mean(t, (0, 2, 3), correction=0)
        # Static shapes: the op is one code object for Dynamo, and its recompile for a second
        # shape would otherwise be symbolic (automatic dynamic shapes), timing another graph.
        torch._dynamo.reset()
        inductor = torch.compile(op, dynamic=False)
        compiled = torch.compile(op, backend="braze", dynamic=False,
                                 options={"cuda_graphs": False})
        for name_, f in (("inductor", inductor), ("braze", compiled)):
            got = f(x)
            want = op(x)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        fns["op_eager"] = lambda: op(x)
        fns["op_inductor"] = lambda: inductor(x)
        fns["op_braze"] = lambda: compiled(x)
        times = timed(fns, args.repeats)
        out[shape] = times
        print(f"## [{n}, {c}, {h}, {w}] f32 channels-last: {parts} partials of {rows} rows "
              f"({name}, {blocks} blocks)")
        for k, v in times.items():
            print(f"  {k:20s} {v:8.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

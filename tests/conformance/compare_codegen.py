#!/usr/bin/env python3
"""Compares what two braze-opt builds generate for the same graphs: the check for a change that
should keep the generated code (a refactor of lowering), or that should change it only where
it says.

    # collect graphs: every graph braze compiles while the tests run, one file each
    BRAZE_LOG=graph python -m pytest -p no:xdist -s tests/python 2> graphs.log
    python tests/conformance/compare_codegen.py split graphs.log corpus/
    # compare two builds over them (extra arguments go to braze-opt)
    python tests/conformance/compare_codegen.py compare OLD/braze-opt NEW/braze-opt corpus/
    python tests/conformance/compare_codegen.py compare OLD/braze-opt NEW/braze-opt corpus/ --cuda

For each graph, `compare` prints nothing when the code is identical, `ORDER` when the loop
programs hold the same lines in another order, `REAL` when they differ, and `FAIL` when the new
build rejects a graph the old one compiles; then the counts, and the kernels and buffers of all
graphs for each build.
"""

import argparse
import hashlib
import os
import subprocess
import sys

MARK = "===== braze: graph =====\n"


def split(log, out):
    """Writes each distinct graph of a BRAZE_LOG=graph log to out/<hash>.txt."""
    os.makedirs(out, exist_ok=True)
    text = open(log, encoding="utf-8", errors="replace").read()
    written = 0
    for block in text.split(MARK)[1:]:
        lines = []
        for line in block.split("\n"):
            lines.append(line)
            if line == "}":
                break
        graph = "\n".join(lines) + "\n"
        path = os.path.join(out, hashlib.sha1(graph.encode()).hexdigest()[:12] + ".txt")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(graph)
            written += 1
    print(f"{written} new graphs in {out}")


def stage(binary, graph, name, extra):
    r = subprocess.run([binary, graph, "--print=" + name, *extra], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def compare(old, new, corpus, extra):
    counts = {"same": 0, "ORDER": 0, "REAL": 0, "FAIL": 0}
    totals = [[0, 0], [0, 0]]  # kernels, buffers: of old, of new
    for name in sorted(os.listdir(corpus)):
        graph = os.path.join(corpus, name)
        # each build's code, schedule and loop program for this graph, each made once
        runs = [{what: stage(b, graph, what, extra) for what in ("code", "schedule", "loops")}
                for b in (old, new)]
        for side, run in enumerate(runs):
            for k, (what, prefix) in enumerate((("schedule", "kernel"), ("loops", "buffer "))):
                totals[side][k] += sum(line.startswith(prefix)
                                       for line in run[what][1].split("\n"))
        (rc_old, code_old), (rc_new, code_new) = runs[0]["code"], runs[1]["code"]
        if rc_old == rc_new and code_old == code_new:
            counts["same"] += 1
            continue
        if rc_new != 0 and rc_old == 0:
            verdict = "FAIL"
        else:
            loops_old, loops_new = (sorted(run["loops"][1].split("\n")) for run in runs)
            verdict = "ORDER" if loops_old == loops_new else "REAL"
        counts[verdict] += 1
        print(verdict, graph, flush=True)
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    for label, (kernels, buffers) in zip(("old", "new"), totals):
        print(f"{label}: {kernels} kernels, {buffers} buffers")
    return 1 if counts["FAIL"] else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="one file per distinct graph of a BRAZE_LOG=graph log")
    s.add_argument("log")
    s.add_argument("out")
    c = sub.add_parser("compare", help="compare two braze-opt builds over a folder of graphs")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("corpus")
    args, extra = p.parse_known_args()
    if args.cmd == "split":
        split(args.log, args.out)
        return 0
    return compare(args.old, args.new, args.corpus, extra)


if __name__ == "__main__":
    sys.exit(main())

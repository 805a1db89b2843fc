/// A site is a forward convolution (y from x and w), a weight gradient (direction 1: w from x
/// and y's gradient, oneDNN's backward-weights primitive) or an input gradient (direction 2:
/// x from y's gradient and w, backward-data); a gradient's primitive is created with a
/// forward-training primitive as its hint. The plan for one set of sizes and strides is made once, under the
/// site's lock:
///   1. memory descriptors with the buffers' own strides; a grouped weight [O, C/g, k..] is
///      viewed as [g, O/g, C/g, k..] (no copy);
///   2. a convolution primitive on the buffers as they are in memory, or, where oneDNN has no
///      good kernel for that layout, on layouts it chooses, with reorders into them before
///      the call and out of them after it (the weight may change between calls, so its
///      reordered copy is never kept);
///   3. the plan is kept for the site's next calls with the same sizes.
/// A call creates memory objects for its pointers and executes on a stream of its thread.
/// oneDNN runs on the OpenMP threads of the process (its GNU OpenMP build shares the pool with
/// braze's kernels and PyTorch), so it honours torch.set_num_threads.
#include "braze/codegen/cpu/DnnlPrelude.h"

namespace braze::codegen {

const char *dnnlPrelude() {
  return R"(#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

extern "C" {
struct braze_dnnl_arg { int arg; void* memory; };
int dnnl_engine_create(void**, int, size_t);
int dnnl_stream_create(void**, void*, unsigned);
int dnnl_stream_wait(void*);
int dnnl_memory_desc_create_with_strides(void**, int, const int64_t*, int, const int64_t*);
int dnnl_memory_desc_create_with_tag(void**, int, const int64_t*, int, int);
int dnnl_memory_desc_destroy(void*);
int dnnl_memory_desc_equal(const void*, const void*);
size_t dnnl_memory_desc_get_size(const void*);
int dnnl_convolution_forward_primitive_desc_create(void**, void*, int, int, const void*,
    const void*, const void*, const void*, const int64_t*, const int64_t*, const int64_t*,
    const int64_t*, const void*);
int dnnl_convolution_backward_weights_primitive_desc_create(void**, void*, int, const void*,
    const void*, const void*, const void*, const int64_t*, const int64_t*, const int64_t*,
    const int64_t*, const void*, const void*);
int dnnl_convolution_backward_data_primitive_desc_create(void**, void*, int, const void*,
    const void*, const void*, const int64_t*, const int64_t*, const int64_t*, const int64_t*,
    const void*, const void*);
int dnnl_primitive_desc_query(const void*, int, int, void*);
const void* dnnl_primitive_desc_query_md(const void*, int, int);
int dnnl_primitive_desc_destroy(void*);
int dnnl_reorder_primitive_desc_create(void**, const void*, void*, const void*, void*, const void*);
int dnnl_primitive_create(void**, const void*);
int dnnl_memory_create(void**, const void*, void*, void*);
int dnnl_memory_destroy(void*);
int dnnl_primitive_execute(const void*, void*, int, const braze_dnnl_arg*);
}

enum {
  braze_dnnl_cpu = 1, braze_dnnl_f32 = 3, braze_dnnl_any = 1, braze_dnnl_training = 64,
  braze_dnnl_inference = 96, braze_dnnl_direct = 1, braze_dnnl_impl_str = 8,
  braze_dnnl_src_md = 129, braze_dnnl_diff_src_md = 130, braze_dnnl_weights_md = 131,
  braze_dnnl_diff_weights_md = 132, braze_dnnl_dst_md = 133, braze_dnnl_diff_dst_md = 134,
  braze_dnnl_src = 1, braze_dnnl_dst = 17, braze_dnnl_weights = 33, braze_dnnl_diff_src = 129,
  braze_dnnl_diff_dst = 145, braze_dnnl_diff_weights = 161
};

// Per direction (forward, weight gradient, input gradient): the query and the execute argument
// of x, w and y, and which of them is the result.
static const int braze_dnnl_query[3][3] = {
    {braze_dnnl_src_md, braze_dnnl_weights_md, braze_dnnl_dst_md},
    {braze_dnnl_src_md, braze_dnnl_diff_weights_md, braze_dnnl_diff_dst_md},
    {braze_dnnl_diff_src_md, braze_dnnl_weights_md, braze_dnnl_diff_dst_md}};
static const int braze_dnnl_argument[3][3] = {
    {braze_dnnl_src, braze_dnnl_weights, braze_dnnl_dst},
    {braze_dnnl_src, braze_dnnl_diff_weights, braze_dnnl_diff_dst},
    {braze_dnnl_diff_src, braze_dnnl_weights, braze_dnnl_diff_dst}};
static const int braze_dnnl_result[3] = {2, 1, 0};

/// One operand of a plan: the descriptor of the buffer as braze holds it and, when the
/// primitive wants another layout, a reorder into (or, for the result, out of) scratch memory
/// the plan owns.
struct braze_dnnl_operand {
  void* md = nullptr;
  const void* own_md = nullptr; // the primitive's layout, when it differs
  void* reorder = nullptr;
  void* scratch = nullptr;
};

struct braze_dnnl_plan {
  std::vector<int64_t> key;
  int direction = 0; // 0: y = conv(x, w); 1: w from x and dy at y; 2: x from dy at y and w
  void *conv_pd = nullptr, *conv = nullptr;
  braze_dnnl_operand x, w, y;
  std::mutex mu; // the scratch memory is the plan's: one call at a time
};

struct braze_dnnl_site {
  std::mutex mu;
  std::vector<braze_dnnl_plan*> plans;
  bool failed = false;
};

static void* braze_dnnl_engine() {
  static void* engine = [] {
    void* e = nullptr;
    return dnnl_engine_create(&e, braze_dnnl_cpu, 0) == 0 ? e : nullptr;
  }();
  return engine;
}

static bool braze_dnnl_has(const void* pd, const char* what) {
  const char* impl = nullptr;
  return dnnl_primitive_desc_query(pd, braze_dnnl_impl_str, 0, &impl) != 0 || !impl ||
         std::strstr(impl, what) != nullptr;
}

static void* braze_dnnl_conv_pd(const void* x, const void* w, const void* y, const int64_t* st,
    const int64_t* dl, const int64_t* pl, const int64_t* pr, int direction) {
  void* pd = nullptr;
  if (dnnl_convolution_forward_primitive_desc_create(&pd, braze_dnnl_engine(),
          direction ? braze_dnnl_training : braze_dnnl_inference, braze_dnnl_direct, x, w,
          nullptr, y, st, dl, pl, pr, nullptr) != 0)
    return nullptr;
  if (!direction)
    return pd;
  void* bwd = nullptr;
  int status = direction == 1
      ? dnnl_convolution_backward_weights_primitive_desc_create(&bwd, braze_dnnl_engine(),
            braze_dnnl_direct, x, w, nullptr, y, st, dl, pl, pr, pd, nullptr)
      : dnnl_convolution_backward_data_primitive_desc_create(&bwd, braze_dnnl_engine(),
            braze_dnnl_direct, x, w, y, st, dl, pl, pr, pd, nullptr);
  dnnl_primitive_desc_destroy(pd);
  return status == 0 ? bwd : nullptr;
}

/// The primitive's layout for `op` (query `what`); if it is not the buffer's, a reorder
/// between the two (into it for inputs, out of it for the result) and scratch memory for it.
static bool braze_dnnl_adapt(const void* pd, int what, braze_dnnl_operand& op, bool result) {
  const void* own = dnnl_primitive_desc_query_md(pd, what, 0);
  if (!own || dnnl_memory_desc_equal(own, op.md))
    return true;
  void* rpd = nullptr;
  bool ok = (result ? dnnl_reorder_primitive_desc_create(&rpd, own, braze_dnnl_engine(), op.md,
                                                         braze_dnnl_engine(), nullptr)
                    : dnnl_reorder_primitive_desc_create(&rpd, op.md, braze_dnnl_engine(), own,
                                                         braze_dnnl_engine(), nullptr)) == 0 &&
            dnnl_primitive_create(&op.reorder, rpd) == 0;
  if (rpd)
    dnnl_primitive_desc_destroy(rpd);
  op.own_md = own;
  op.scratch = ok ? std::aligned_alloc(64, (dnnl_memory_desc_get_size(own) + 63) / 64 * 64) : nullptr;
  return ok && op.scratch;
}

/// Picks the primitive: on the buffers as they are, or, where oneDNN has only its reference or
/// its unfold-and-gemm kernel for them, on the layouts it chooses for the weight (and then for
/// every operand), reordering around the call.
static braze_dnnl_plan* braze_dnnl_make_plan(int rank, const int64_t* xd, const int64_t* xs,
    const int64_t* wd, const int64_t* ws, const int64_t* yd, const int64_t* ys, int64_t groups,
    const int64_t* stride, const int64_t* padding, const int64_t* dilation, int direction) {
  if (!braze_dnnl_engine())
    return nullptr;
  int spatial = rank - 2;
  int64_t wdims[13] = {0}, wstrides[13] = {0}, st[12] = {0}, dl[12] = {0}, pl[12] = {0},
          pr[12] = {0};
  int wrank = rank;
  if (groups > 1) {
    wrank = rank + 1;
    wdims[0] = groups;
    wdims[1] = wd[0] / groups;
    wstrides[0] = ws[0] * (wd[0] / groups);
    wstrides[1] = ws[0];
    for (int i = 1; i < rank; ++i) {
      wdims[i + 1] = wd[i];
      wstrides[i + 1] = ws[i];
    }
  } else {
    for (int i = 0; i < rank; ++i) {
      wdims[i] = wd[i];
      wstrides[i] = ws[i];
    }
  }
  for (int i = 0; i < spatial; ++i) {
    st[i] = stride[i];
    dl[i] = dilation[i] - 1;
    pl[i] = padding[i];
    // The right padding that makes oneDNN's output size equal y's.
    pr[i] = (yd[2 + i] - 1) * stride[i] + (wd[2 + i] - 1) * dilation[i] + 1 - xd[2 + i] - padding[i];
  }
  braze_dnnl_plan* p = new braze_dnnl_plan();
  p->direction = direction;
  if (dnnl_memory_desc_create_with_strides(&p->x.md, rank, xd, braze_dnnl_f32, xs) != 0 ||
      dnnl_memory_desc_create_with_strides(&p->y.md, rank, yd, braze_dnnl_f32, ys) != 0 ||
      dnnl_memory_desc_create_with_strides(&p->w.md, wrank, wdims, braze_dnnl_f32, wstrides) != 0)
    return nullptr; // the plan's pieces are leaked: this happens at most once per site
  // Candidates: the buffers as they are; the weight in oneDNN's layout; every operand in
  // oneDNN's layouts. The first that runs neither the reference kernel nor the unfold-and-gemm
  // one wins, else the first that is not the reference.
  void* mds[3][3] = {{p->x.md, p->w.md, p->y.md}, {p->x.md, nullptr, p->y.md},
                     {nullptr, nullptr, nullptr}};
  void* owned[3] = {nullptr, nullptr, nullptr};
  dnnl_memory_desc_create_with_tag(&owned[0], rank, xd, braze_dnnl_f32, braze_dnnl_any);
  dnnl_memory_desc_create_with_tag(&owned[1], wrank, wdims, braze_dnnl_f32, braze_dnnl_any);
  dnnl_memory_desc_create_with_tag(&owned[2], rank, yd, braze_dnnl_f32, braze_dnnl_any);
  mds[1][1] = mds[2][1] = owned[1];
  mds[2][0] = owned[0];
  mds[2][2] = owned[2];
  void* fallback = nullptr;
  for (int c = 0; c < 3 && !p->conv_pd; ++c) {
    if (!mds[c][0] || !mds[c][1] || !mds[c][2])
      continue;
    void* pd = braze_dnnl_conv_pd(mds[c][0], mds[c][1], mds[c][2], st, dl, pl, pr, direction);
    if (!pd)
      continue;
    if (!braze_dnnl_has(pd, "ref") && !braze_dnnl_has(pd, "gemm"))
      p->conv_pd = pd;
    else if (!fallback && !braze_dnnl_has(pd, "ref"))
      fallback = pd;
    else
      dnnl_primitive_desc_destroy(pd);
  }
  if (!p->conv_pd)
    p->conv_pd = fallback;
  else if (fallback)
    dnnl_primitive_desc_destroy(fallback);
  for (void* md : owned)
    if (md)
      dnnl_memory_desc_destroy(md);
  const int* query = braze_dnnl_query[direction];
  const int result = braze_dnnl_result[direction];
  if (!p->conv_pd || !braze_dnnl_adapt(p->conv_pd, query[0], p->x, result == 0) ||
      !braze_dnnl_adapt(p->conv_pd, query[1], p->w, result == 1) ||
      !braze_dnnl_adapt(p->conv_pd, query[2], p->y, result == 2) ||
      dnnl_primitive_create(&p->conv, p->conv_pd) != 0)
    return nullptr;
  return p;
}

static bool braze_dnnl_conv(braze_dnnl_site& site, int rank, const int64_t* xd,
    const int64_t* xs, const int64_t* wd, const int64_t* ws, const int64_t* yd,
    const int64_t* ys, int64_t groups, const int64_t* stride, const int64_t* padding,
    const int64_t* dilation, const void* x, const void* w, const void* y, int direction) {
  if (rank < 3 || rank > 5 || direction < 0 || direction > 2)
    return false;
  std::vector<int64_t> key{direction};
  for (const int64_t* a : {xd, xs, wd, ws, yd, ys})
    key.insert(key.end(), a, a + rank);
  braze_dnnl_plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(site.mu);
    if (site.failed)
      return false;
    for (braze_dnnl_plan* p : site.plans)
      if (p->key == key)
        plan = p;
    if (!plan) {
      plan = braze_dnnl_make_plan(rank, xd, xs, wd, ws, yd, ys, groups, stride, padding, dilation,
                                  direction);
      if (!plan) {
        site.failed = true;
        return false;
      }
      plan->key = std::move(key);
      site.plans.push_back(plan);
    }
  }
  static thread_local void* stream = nullptr;
  if (!stream && dnnl_stream_create(&stream, braze_dnnl_engine(), 1) != 0) {
    stream = nullptr;
    return false;
  }
  std::lock_guard<std::mutex> lock(plan->mu);
  void* mem[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  bool ok = true;
  // The buffers, then the plan's scratch for each operand that is reordered. The result is y,
  // w or x (by direction); the other two are read.
  braze_dnnl_operand* ops[3] = {&plan->x, &plan->w, &plan->y};
  void* data[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  const int result = braze_dnnl_result[direction];
  const int* argument = braze_dnnl_argument[direction];
  void* args[3];
  for (int i = 0; i < 3; ++i) {
    ok = ok && dnnl_memory_create(&mem[i], ops[i]->md, braze_dnnl_engine(), data[i]) == 0;
    if (ops[i]->reorder)
      ok = ok && dnnl_memory_create(&mem[3 + i], ops[i]->own_md, braze_dnnl_engine(),
                                    ops[i]->scratch) == 0;
    args[i] = ops[i]->reorder ? mem[3 + i] : mem[i];
  }
  for (int i = 0; ok && i < 3; ++i)
    if (i != result && ops[i]->reorder) {
      braze_dnnl_arg r[2] = {{braze_dnnl_src, mem[i]}, {braze_dnnl_dst, mem[3 + i]}};
      ok = dnnl_primitive_execute(ops[i]->reorder, stream, 2, r) == 0;
    }
  braze_dnnl_arg c[3] = {{argument[0], args[0]}, {argument[1], args[1]}, {argument[2], args[2]}};
  ok = ok && dnnl_primitive_execute(plan->conv, stream, 3, c) == 0;
  if (ok && ops[result]->reorder) {
    braze_dnnl_arg r[2] = {{braze_dnnl_src, mem[3 + result]}, {braze_dnnl_dst, mem[result]}};
    ok = dnnl_primitive_execute(ops[result]->reorder, stream, 2, r) == 0;
  }
  ok = ok && dnnl_stream_wait(stream) == 0;
  for (void* m : mem)
    if (m)
      dnnl_memory_destroy(m);
  return ok;
}

)";
}

} // namespace braze::codegen

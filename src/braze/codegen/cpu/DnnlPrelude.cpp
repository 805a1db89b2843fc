/// The plan for one set of sizes and strides is made once, under the site's lock:
///   1. memory descriptors with the buffers' own strides; a grouped weight [O, C/g, k..] is
///      viewed as [g, O/g, C/g, k..] (no copy);
///   2. a convolution primitive on the weight as it is in memory; if oneDNN only has its
///      reference kernel for that layout, a second primitive that chooses its own weight
///      layout, with a reorder of the weight into it before each call (the weight may change
///      between calls, so the reordered copy is never kept);
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
  braze_dnnl_cpu = 1, braze_dnnl_f32 = 3, braze_dnnl_any = 1, braze_dnnl_inference = 96,
  braze_dnnl_direct = 1, braze_dnnl_impl_str = 8, braze_dnnl_weights_md = 131,
  braze_dnnl_src = 1, braze_dnnl_dst = 17, braze_dnnl_weights = 33
};

struct braze_dnnl_plan {
  std::vector<int64_t> key;
  void *x_md = nullptr, *w_md = nullptr, *y_md = nullptr;
  void *conv_pd = nullptr, *conv = nullptr;
  const void* packed_md = nullptr; // the primitive's own weight layout, when it needs one
  void* reorder = nullptr;
  size_t packed_bytes = 0;
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

static bool braze_dnnl_reference(const void* pd) {
  const char* impl = nullptr;
  return dnnl_primitive_desc_query(pd, braze_dnnl_impl_str, 0, &impl) != 0 || !impl ||
         std::strncmp(impl, "ref", 3) == 0;
}

static braze_dnnl_plan* braze_dnnl_make_plan(int rank, const int64_t* xd, const int64_t* xs,
    const int64_t* wd, const int64_t* ws, const int64_t* yd, const int64_t* ys, int64_t groups,
    const int64_t* stride, const int64_t* padding, const int64_t* dilation) {
  void* engine = braze_dnnl_engine();
  if (!engine)
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
  bool ok = dnnl_memory_desc_create_with_strides(&p->x_md, rank, xd, braze_dnnl_f32, xs) == 0 &&
            dnnl_memory_desc_create_with_strides(&p->y_md, rank, yd, braze_dnnl_f32, ys) == 0 &&
            dnnl_memory_desc_create_with_strides(&p->w_md, wrank, wdims, braze_dnnl_f32, wstrides) == 0;
  if (ok && dnnl_convolution_forward_primitive_desc_create(&p->conv_pd, engine,
          braze_dnnl_inference, braze_dnnl_direct, p->x_md, p->w_md, nullptr, p->y_md, st, dl,
          pl, pr, nullptr) == 0 && braze_dnnl_reference(p->conv_pd)) {
    void* any = nullptr;
    void* pd = nullptr;
    if (dnnl_memory_desc_create_with_tag(&any, wrank, wdims, braze_dnnl_f32, braze_dnnl_any) == 0 &&
        dnnl_convolution_forward_primitive_desc_create(&pd, engine, braze_dnnl_inference,
            braze_dnnl_direct, p->x_md, any, nullptr, p->y_md, st, dl, pl, pr, nullptr) == 0) {
      if (braze_dnnl_reference(pd)) {
        dnnl_primitive_desc_destroy(pd);
      } else {
        dnnl_primitive_desc_destroy(p->conv_pd);
        p->conv_pd = pd;
        const void* packed = dnnl_primitive_desc_query_md(pd, braze_dnnl_weights_md, 0);
        if (packed && !dnnl_memory_desc_equal(packed, p->w_md)) {
          void* rpd = nullptr;
          ok = dnnl_reorder_primitive_desc_create(&rpd, p->w_md, engine, packed, engine, nullptr) == 0 &&
               dnnl_primitive_create(&p->reorder, rpd) == 0;
          if (rpd)
            dnnl_primitive_desc_destroy(rpd);
          p->packed_md = packed;
          p->packed_bytes = dnnl_memory_desc_get_size(packed);
        }
      }
    }
    if (any)
      dnnl_memory_desc_destroy(any);
  }
  ok = ok && p->conv_pd && dnnl_primitive_create(&p->conv, p->conv_pd) == 0;
  if (!ok)
    return nullptr; // the plan's pieces are leaked: this happens at most once per site
  return p;
}

static bool braze_dnnl_conv(braze_dnnl_site& site, int rank, const int64_t* xd,
    const int64_t* xs, const int64_t* wd, const int64_t* ws, const int64_t* yd,
    const int64_t* ys, int64_t groups, const int64_t* stride, const int64_t* padding,
    const int64_t* dilation, const void* x, const void* w, void* y) {
  if (rank < 3 || rank > 5)
    return false;
  std::vector<int64_t> key;
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
      plan = braze_dnnl_make_plan(rank, xd, xs, wd, ws, yd, ys, groups, stride, padding, dilation);
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
  void *mx = nullptr, *mw = nullptr, *my = nullptr, *mp = nullptr, *packed = nullptr;
  bool ok = dnnl_memory_create(&mx, plan->x_md, braze_dnnl_engine(), const_cast<void*>(x)) == 0 &&
            dnnl_memory_create(&mw, plan->w_md, braze_dnnl_engine(), const_cast<void*>(w)) == 0 &&
            dnnl_memory_create(&my, plan->y_md, braze_dnnl_engine(), y) == 0;
  void* weights = mw;
  if (ok && plan->reorder) {
    packed = std::aligned_alloc(64, (plan->packed_bytes + 63) / 64 * 64);
    ok = packed && dnnl_memory_create(&mp, plan->packed_md, braze_dnnl_engine(), packed) == 0;
    braze_dnnl_arg args[2] = {{braze_dnnl_src, mw}, {braze_dnnl_dst, mp}};
    ok = ok && dnnl_primitive_execute(plan->reorder, stream, 2, args) == 0;
    weights = mp;
  }
  braze_dnnl_arg args[3] = {{braze_dnnl_src, mx}, {braze_dnnl_weights, weights}, {braze_dnnl_dst, my}};
  ok = ok && dnnl_primitive_execute(plan->conv, stream, 3, args) == 0 && dnnl_stream_wait(stream) == 0;
  for (void* m : {mx, mw, my, mp})
    if (m)
      dnnl_memory_destroy(m);
  std::free(packed);
  return ok;
}

)";
}

} // namespace braze::codegen

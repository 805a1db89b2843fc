#pragma once
/// The oneDNN glue a CPU module with convolution kernels carries: declarations of the oneDNN 3
/// C API entry points it calls (the module needs no oneDNN headers) and braze_dnnl_conv.

namespace braze::codegen {

/// Defines `braze_dnnl_site` (one per call site: its plans, by sizes and strides) and
///   bool braze_dnnl_conv(braze_dnnl_site &site, int rank, x dims, x strides, w dims,
///                        w strides, y dims, y strides, groups, stride, padding, dilation,
///                        const void *x, const void *w, void *y)
/// which computes an f32 convolution (loop::ConvSpec's function) into y and returns true, or
/// returns false when oneDNN declines it (the caller then runs the loop nest).
const char *dnnlPrelude();

} // namespace braze::codegen

// The tensor front end of the GEMM: TensorRefs (from any framework) -> typed GEMM arguments.
//
// Checks what only tensors can tell (devices, strides, the shapes of scale tensors), then
// hands the raw pointers to gemm_host or gemm_cuda, which run validate_gemm.
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "gemm/gemm.h"
#include "kernels/kernel_args.h"

namespace overlap::gemm {

namespace {

constexpr const char* kOp = "gemm";

// A 2-D tensor with unit column stride: [rows, cols] with leading dimension stride(0).
void check_matrix(const TensorRef& t, const char* what) {
  OVERLAP_CHECK_ARG(t.shape.size() == 2, kOp << ": " << what << " must be 2-D, got " << t.describe()
                                             << "; flatten leading dimensions first");
  OVERLAP_CHECK_ARG(t.shape[1] == 1 || t.strides[1] == 1,
                    kOp << ": " << what << " must have unit column stride (row-major rows), got "
                        << t.describe() << " with strides " << kernels::shape_string(t.strides)
                        << "; pass the transpose flag instead of a transposed view, or call "
                           ".contiguous()");
}

std::int64_t leading_dim(const TensorRef& t) {
  // A single row has no meaningful row stride: any value works, the row's length is safest.
  return t.shape[0] == 1 ? t.shape[1] : t.strides[0];
}

GemmOperand operand(const TensorRef& t, const TensorRef* scale_inv, ScalingMode scaling,
                    bool transposed, const char* what, const char* scale_what) {
  check_matrix(t, what);
  GemmOperand x;
  x.data = t.data;
  x.dtype = t.dtype;
  x.rows = t.shape[0];
  x.cols = t.shape[1];
  x.ld = leading_dim(t);
  x.transposed = transposed;
  x.scaling = scaling;
  if (scale_inv == nullptr) return x;
  const std::int64_t rb = kernels::ceil_div(x.rows, 128);
  const std::int64_t cb = kernels::ceil_div(x.cols, 128);
  switch (scaling) {
    case ScalingMode::kTensor:
      kernels::check_float32_elements(*scale_inv, 1, kOp, scale_what);
      break;
    case ScalingMode::kBlock1x128:
      OVERLAP_CHECK_ARG(scale_inv->dtype == DType::kFloat32, kOp << ": " << scale_what
                                                                 << " must be float32, got "
                                                                 << scale_inv->describe());
      kernels::check_shape(*scale_inv, {x.rows, cb}, kOp, scale_what);
      break;
    case ScalingMode::kBlock128x128:
      OVERLAP_CHECK_ARG(scale_inv->dtype == DType::kFloat32, kOp << ": " << scale_what
                                                                 << " must be float32, got "
                                                                 << scale_inv->describe());
      kernels::check_shape(*scale_inv, {rb, cb}, kOp, scale_what);
      break;
    case ScalingMode::kNone:
    case ScalingMode::kMxfp8:
      break;  // validate_gemm names what is wrong with these
  }
  x.scale_inv = static_cast<const float*>(scale_inv->data);
  return x;
}

}  // namespace

void gemm(const GemmTensors& t, const GemmTensorOptions& o, cudaStream_t stream,
          const TuneRequest* tune) {
  OVERLAP_CHECK_ARG(t.a != nullptr && t.b != nullptr && t.out != nullptr,
                    kOp << ": a, b and out are required");
  const GemmOperand a = operand(*t.a, t.a_scale_inv, o.a_scaling, o.transa, "a", "a_scale_inv");
  const GemmOperand b = operand(*t.b, t.b_scale_inv, o.b_scaling, o.transb, "b", "b_scale_inv");
  const std::int64_t n = o.transb ? b.rows : b.cols;

  check_matrix(*t.out, "out");
  GemmOutput d;
  d.data = t.out->data;
  d.dtype = t.out->dtype;
  d.rows = t.out->shape[0];
  d.cols = t.out->shape[1];
  d.ld = leading_dim(*t.out);
  d.row_offset = o.row_offset;
  if (t.out_scale != nullptr) {
    kernels::check_float32_elements(*t.out_scale, 1, kOp, "out_scale");
    d.scale = static_cast<const float*>(t.out_scale->data);
  }
  if (t.out_amax != nullptr) {
    kernels::check_float32_elements(*t.out_amax, 1, kOp, "out_amax");
    d.amax = static_cast<float*>(t.out_amax->data);
  }

  GemmOptions options = o.options;
  options.bias = nullptr;
  if (t.bias != nullptr) {
    OVERLAP_CHECK_ARG(t.bias->numel() == n && t.bias->is_contiguous(),
                      kOp << ": bias must be a contiguous tensor of n = " << n << " elements, got "
                          << t.bias->describe());
    options.bias = t.bias->data;
    options.bias_dtype = t.bias->dtype;
  }

  const std::vector<const TensorRef*> all = {t.a,           t.b,    t.out,       t.a_scale_inv,
                                             t.b_scale_inv, t.bias, t.out_scale, t.out_amax};
  for (const TensorRef* x : all) {
    if (x == nullptr) continue;
    OVERLAP_CHECK_ARG(x->device == t.a->device, kOp << ": all tensors must be on one device; a is "
                                                    << t.a->describe() << ", another is "
                                                    << x->describe());
  }
  if (t.a->on_host()) {
    gemm_host(a, b, d, options);
    if (tune != nullptr && tune->record != nullptr) {
      *tune->record = GemmTuneRecord{TuneStatus::kUntuned, 0, {}, "the host reference"};
    }
    return;
  }
#ifdef OVERLAP_WITH_CUDA
  gemm_cuda(a, b, d, options, t.a->device, stream, tune);
#else
  OVERLAP_THROW(kUnsupported,
                kOp << " on " << t.a->describe() << ": this build of overlap has no CUDA support");
#endif
}

}  // namespace overlap::gemm

#ifndef OVERLAP_WITH_CUDA
namespace overlap::gemm {

// Without CUDA there are no per-device resources: nothing cached, nothing to release.
GemmTarget gemm_target(int device) {
  OVERLAP_CHECK(device < 0, kUnsupported,
                "gemm on cuda:" << device << ": this build of overlap has no CUDA support");
  return GemmTarget{};
}
GemmCacheStats gemm_cache_stats(int /*device*/) {
  return {};
}
void gemm_clear_cache() {}
void gemm_release_resources() {}

}  // namespace overlap::gemm
#endif

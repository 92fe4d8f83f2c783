// validate_gemm: every rule a GEMM call must satisfy, checked before any memory is touched.
//
// NOTE [gemm rules]: the rules are the intersection of what cuBLASLt documents and what the
// tests of its main users (TransformerEngine, torch._scaled_mm) enforce, applied to the host
// reference as well, so that the host transport refuses exactly the calls the GPU refuses:
//   - inputs are both FP8 (e4m3/e5m2, not e5m2 x e5m2) or both the same bf16/fp16/fp32;
//   - every pointer is 16-byte aligned and every leading dimension a multiple of 16 bytes
//     (cuBLASLt's FP8 requirement, and what keeps its fastest kernels eligible for the rest);
//   - FP8: K a multiple of 16; FP8 outputs need a scale and cannot accumulate (beta = 0);
//   - block scaling: 1x128 x 1x128, 1x128 x 128x128 or 128x128 x 1x128, K-contiguous operands,
//     split accumulator, bf16/fp32 output, bias but no GELU, n a multiple of 8 and the rows of
//     a 1x128 operand a multiple of 4 (cuBLASLt's VEC128 scale layout);
//   - GPU only: FP8 needs sm_89+, K-contiguous FP8 operands on sm_90 (NOTE [fp8 layout]),
//     block scaling exists on sm_90 only.
#include <cmath>
#include <cstdint>

#include "common/errors.h"
#include "gemm/gemm.h"

namespace overlap::gemm {

const char* scaling_mode_name(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kNone:
      return "none";
    case ScalingMode::kTensor:
      return "tensor";
    case ScalingMode::kBlock1x128:
      return "block_1x128";
    case ScalingMode::kBlock128x128:
      return "block_128x128";
    case ScalingMode::kMxfp8:
      return "mxfp8";
  }
  return "unknown";
}

namespace {

constexpr std::int64_t kAlign = 16;

bool is_block(ScalingMode mode) {
  return mode == ScalingMode::kBlock1x128 || mode == ScalingMode::kBlock128x128;
}

bool is_float_input(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

bool aligned(const void* p, std::int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes) == 0;
}

// The operand's own checks; `name` is "A" or "B".
void check_operand(const GemmOperand& x, const char* name) {
  OVERLAP_CHECK_ARG(x.data != nullptr, "gemm: operand " << name << " has a null data pointer");
  OVERLAP_CHECK_ARG(x.rows >= 1 && x.cols >= 1, "gemm: operand " << name << " is stored [" << x.rows
                                                                 << ", " << x.cols
                                                                 << "]; empty GEMMs are not "
                                                                    "launched, skip the call");
  OVERLAP_CHECK_ARG(x.ld >= x.cols, "gemm: operand " << name << " has leading dimension " << x.ld
                                                     << " < its " << x.cols
                                                     << " columns; rows must not overlap");
  OVERLAP_CHECK_ARG(is_float_input(x.dtype) || dtype_is_fp8(x.dtype),
                    "gemm: operand "
                        << name << " must be float32, float16, bfloat16, "
                        << "float8_e4m3fn or float8_e5m2, got " << dtype_name(x.dtype)
                        << (x.dtype == DType::kUInt8 ? "; view raw FP8 bytes as their FP8 dtype"
                                                     : ""));
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(x.dtype));
  OVERLAP_CHECK_ARG(aligned(x.data, kAlign), "gemm: operand " << name << " data pointer " << x.data
                                                              << " is not 16-byte aligned");
  OVERLAP_CHECK_ARG((x.ld * esize) % kAlign == 0 || x.rows == 1,
                    "gemm: operand " << name << " leading dimension " << x.ld << " ("
                                     << x.ld * esize << " bytes of " << dtype_name(x.dtype)
                                     << ") is not a multiple of 16 bytes; pad the rows");
  if (!dtype_is_fp8(x.dtype)) {
    OVERLAP_CHECK_ARG(x.scaling == ScalingMode::kNone && x.scale_inv == nullptr,
                      "gemm: operand " << name << " is " << dtype_name(x.dtype)
                                       << ", which takes no scale_inv (scaling "
                                       << scaling_mode_name(x.scaling) << ")");
    return;
  }
  OVERLAP_CHECK_ARG(x.scaling != ScalingMode::kNone,
                    "gemm: FP8 operand " << name << " (" << dtype_name(x.dtype)
                                         << ") needs a scaling mode and its scale_inv");
  OVERLAP_CHECK(x.scaling != ScalingMode::kMxfp8, kUnsupported,
                "gemm: operand " << name
                                 << " is MXFP8; cuBLASLt has no MXFP8 GEMM on Hopper and "
                                    "overlap has none: dequantize it and run a BF16 GEMM "
                                    "(the MXFP8 fallback of docs/design.md §4)");
  OVERLAP_CHECK_ARG(x.scale_inv != nullptr, "gemm: FP8 operand " << name << " (scaling "
                                                                 << scaling_mode_name(x.scaling)
                                                                 << ") has no scale_inv");
  OVERLAP_CHECK_ARG(aligned(x.scale_inv, is_block(x.scaling) ? kAlign : 4),
                    "gemm: scale_inv of operand "
                        << name << " at " << static_cast<const void*>(x.scale_inv) << " is not "
                        << (is_block(x.scaling) ? 16 : 4) << "-byte aligned");
}

bool fp8_out_allowed(DType out, DType a, DType b) {
  if (out == DType::kFloat8E4M3) return true;
  // cuBLASLt writes e5m2 only when an input is e5m2.
  return out == DType::kFloat8E5M2 && (a == DType::kFloat8E5M2 || b == DType::kFloat8E5M2);
}

}  // namespace

GemmShape validate_gemm(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
                        const GemmOptions& o, const GemmTarget& target) {
  check_operand(a, "A");
  check_operand(b, "B");
  GemmShape s;
  s.m = a.transposed ? a.cols : a.rows;
  s.k = a.transposed ? a.rows : a.cols;
  s.n = b.transposed ? b.rows : b.cols;
  const std::int64_t kb = b.transposed ? b.cols : b.rows;
  OVERLAP_CHECK_ARG(s.k == kb, "gemm: inner dimensions differ: op(A) is ["
                                   << s.m << ", " << s.k << "] (A stored [" << a.rows << ", "
                                   << a.cols << "], transa=" << (a.transposed ? "True" : "False")
                                   << "), op(B) is [" << kb << ", " << s.n << "] (B stored ["
                                   << b.rows << ", " << b.cols
                                   << "], transb=" << (b.transposed ? "True" : "False") << ")");

  // ---- input formats -----------------------------------------------------------------------
  const bool fp8 = dtype_is_fp8(a.dtype);
  OVERLAP_CHECK_ARG(fp8 == dtype_is_fp8(b.dtype) && (fp8 || a.dtype == b.dtype),
                    "gemm: A and B must both be FP8 or both have the same dtype; got A "
                        << dtype_name(a.dtype) << ", B " << dtype_name(b.dtype)
                        << " (quantize or dequantize one of them)");
  const bool block = is_block(a.scaling) || is_block(b.scaling);
  if (fp8) {
    OVERLAP_CHECK(!(a.dtype == DType::kFloat8E5M2 && b.dtype == DType::kFloat8E5M2), kUnsupported,
                  "gemm: float8_e5m2 x float8_e5m2 has no cuBLASLt kernel; quantize one "
                  "operand (usually the forward tensor) as float8_e4m3fn");
    OVERLAP_CHECK_ARG(s.k % 16 == 0, "gemm: FP8 GEMMs need K a multiple of 16, got K = "
                                         << s.k << "; pad K with zeros");
  }
  if (block) {
    OVERLAP_CHECK(is_block(a.scaling) && is_block(b.scaling), kUnsupported,
                  "gemm: block-scaled and per-tensor FP8 operands cannot be mixed (A "
                      << scaling_mode_name(a.scaling) << ", B " << scaling_mode_name(b.scaling)
                      << "); quantize both with block scaling");
    OVERLAP_CHECK(
        !(a.scaling == ScalingMode::kBlock128x128 && b.scaling == ScalingMode::kBlock128x128),
        kUnsupported,
        "gemm: 128x128 x 128x128 block scaling has no cuBLASLt kernel; quantize the "
        "activation/gradient operand with 1x128 blocks");
    OVERLAP_CHECK(!a.transposed && b.transposed, kUnsupported,
                  "gemm: block-scaled operands must be K-contiguous (transa=False, transb=True; "
                  "got transa="
                      << (a.transposed ? "True" : "False")
                      << ", transb=" << (b.transposed ? "True" : "False")
                      << "): the blocks run along K; pass the columnwise (transposed) data");
    OVERLAP_CHECK(!o.fast_accum, kUnsupported,
                  "gemm: block-scaled FP8 GEMMs always use the split accumulator; pass "
                  "fast_accum=False");
    OVERLAP_CHECK(!o.gelu, kUnsupported,
                  "gemm: cuBLASLt has no GELU epilogue for block-scaled FP8 GEMMs; apply GELU "
                  "after the GEMM");
    OVERLAP_CHECK_ARG(s.n % 8 == 0, "gemm: block-scaled FP8 GEMMs need n a multiple of 8, got n = "
                                        << s.n << "; pad the output columns");
    OVERLAP_CHECK_ARG(a.scaling != ScalingMode::kBlock1x128 || s.m % 4 == 0,
                      "gemm: a 1x128-scaled A needs m a multiple of 4 (cuBLASLt's scale "
                      "layout), got m = "
                          << s.m << "; pad the rows");
  }

  // ---- output ------------------------------------------------------------------------------
  OVERLAP_CHECK_ARG(d.data != nullptr, "gemm: the output has a null data pointer");
  OVERLAP_CHECK_ARG(d.cols == s.n,
                    "gemm: the output has " << d.cols << " columns; op(A) @ op(B) has n = " << s.n);
  OVERLAP_CHECK_ARG(d.ld >= d.cols,
                    "gemm: output leading dimension " << d.ld << " < its " << d.cols << " columns");
  OVERLAP_CHECK_ARG(d.row_offset >= 0 && d.row_offset + s.m <= d.rows,
                    "gemm: output rows [" << d.row_offset << ", " << d.row_offset + s.m
                                          << ") do not fit the output buffer of " << d.rows
                                          << " rows");
  const bool fp8_out = dtype_is_fp8(d.dtype);
  if (!fp8) {
    OVERLAP_CHECK_ARG(d.dtype == a.dtype || d.dtype == DType::kFloat32,
                      "gemm: " << dtype_name(a.dtype) << " inputs write " << dtype_name(a.dtype)
                               << " or float32 outputs, got " << dtype_name(d.dtype));
  } else if (block) {
    OVERLAP_CHECK(d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat32, kUnsupported,
                  "gemm: block-scaled FP8 GEMMs write bfloat16 or float32 outputs, got "
                      << dtype_name(d.dtype));
  } else {
    OVERLAP_CHECK_ARG(d.dtype == DType::kFloat32 || d.dtype == DType::kBFloat16 ||
                          d.dtype == DType::kFloat16 || fp8_out_allowed(d.dtype, a.dtype, b.dtype),
                      "gemm: FP8 inputs " << dtype_name(a.dtype) << " x " << dtype_name(b.dtype)
                                          << " cannot write " << dtype_name(d.dtype)
                                          << " (float32, bfloat16, float16, float8_e4m3fn, and "
                                             "float8_e5m2 when an input is e5m2)");
  }
  const std::int64_t out_esize = static_cast<std::int64_t>(dtype_size(d.dtype));
  const char* first_row = static_cast<const char*>(d.data) + d.row_offset * d.ld * out_esize;
  OVERLAP_CHECK_ARG(aligned(first_row, kAlign), "gemm: the output's first written row (row_offset "
                                                    << d.row_offset
                                                    << ") is not 16-byte "
                                                       "aligned");
  OVERLAP_CHECK_ARG((d.ld * out_esize) % kAlign == 0 || (s.m == 1 && d.rows == 1),
                    "gemm: output leading dimension " << d.ld << " (" << d.ld * out_esize
                                                      << " bytes) is not a multiple of 16 bytes");
  if (fp8_out) {
    OVERLAP_CHECK_ARG(d.scale != nullptr, "gemm: an FP8 output ("
                                              << dtype_name(d.dtype)
                                              << ") needs its quantization scale (out_scale)");
    OVERLAP_CHECK_ARG(aligned(d.scale, 4) && aligned(d.amax, 4),
                      "gemm: out_scale and out_amax must be float-aligned");
    OVERLAP_CHECK_ARG(o.beta == 0.0f, "gemm: an FP8 output cannot accumulate (beta = "
                                          << o.beta << "); accumulate in bfloat16 or float32");
  } else {
    OVERLAP_CHECK_ARG(d.scale == nullptr && d.amax == nullptr,
                      "gemm: out_scale and out_amax belong to FP8 outputs; the output is "
                          << dtype_name(d.dtype));
  }

  // ---- options -----------------------------------------------------------------------------
  OVERLAP_CHECK_ARG(
      std::isfinite(o.alpha) && std::isfinite(o.beta),
      "gemm: alpha and beta must be finite (alpha " << o.alpha << ", beta " << o.beta << ")");
  OVERLAP_CHECK_ARG(!o.fast_accum || fp8, "gemm: fast_accum applies to FP8 GEMMs only; inputs are "
                                              << dtype_name(a.dtype));
  if (o.bias != nullptr) {
    DType want = d.dtype;  // non-FP8 GEMMs: the bias has the output's dtype
    if (fp8) want = d.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    const bool fp8_out_fp16_bias = fp8_out && o.bias_dtype == DType::kFloat16;
    OVERLAP_CHECK_ARG(o.bias_dtype == want || fp8_out_fp16_bias,
                      "gemm: the bias of a " << dtype_name(a.dtype) << " GEMM writing "
                                             << dtype_name(d.dtype) << " must be "
                                             << dtype_name(want) << (fp8_out ? " or float16" : "")
                                             << ", got " << dtype_name(o.bias_dtype));
    OVERLAP_CHECK_ARG(aligned(o.bias, kAlign), "gemm: the bias pointer " << o.bias
                                                                         << " is not 16-byte "
                                                                            "aligned");
  }
  OVERLAP_CHECK_ARG(o.sm_count >= 0,
                    "gemm: sm_count must be >= 0 (0 = all SMs), got " << o.sm_count);

  // ---- hardware ----------------------------------------------------------------------------
  if (!target.host) {
    const int cc = target.cc_major * 10 + target.cc_minor;
    OVERLAP_CHECK_ARG(o.sm_count <= target.sm_count, "gemm: sm_count "
                                                         << o.sm_count << " exceeds the device's "
                                                         << target.sm_count << " SMs");
    if (fp8) {
      OVERLAP_CHECK(cc >= 89, kUnsupported,
                    "gemm: FP8 GEMMs need compute capability 8.9 or newer, the device has "
                        << target.cc_major << "." << target.cc_minor);
      OVERLAP_CHECK(target.cc_major != 9 || (!a.transposed && b.transposed), kUnsupported,
                    "gemm: FP8 GEMMs on sm_90 need both operands K-contiguous (transa=False, "
                    "transb=True; got transa="
                        << (a.transposed ? "True" : "False")
                        << ", transb=" << (b.transposed ? "True" : "False")
                        << "); pass the columnwise (transposed) FP8 data (NOTE [fp8 layout])");
    }
    OVERLAP_CHECK(!block || target.cc_major == 9, kUnsupported,
                  "gemm: block-scaled FP8 GEMMs exist in cuBLASLt on Hopper (sm_90) only; the "
                  "device is sm_"
                      << target.cc_major << target.cc_minor);
  }
  return s;
}

}  // namespace overlap::gemm

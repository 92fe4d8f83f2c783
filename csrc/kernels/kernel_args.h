// Argument checks shared by the quantization kernels' dispatchers.
//
// Every dispatcher validates all of its arguments before touching memory, so a bad call fails
// with an InvalidArgumentError naming the op, the argument, what was expected and what was
// given, never with a crash or a silently wrong result.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_ref.h"

namespace overlap::kernels {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// "[3, 4]".
std::string shape_string(const std::vector<std::int64_t>& shape);

// x is contiguous and float32, float16 or bfloat16.
void check_float_input(const TensorRef& x, const char* op, const char* what);

// x is additionally 2-D [rows, cols].
void check_float_matrix(const TensorRef& x, const char* op, const char* what);

// fp8_dtype names an FP8 format (float8_e4m3fn or float8_e5m2).
void check_fp8_format(DType fp8_dtype, const char* op);

// NOTE [fp8 carriers]: FP8 data travels either in a tensor of the FP8 dtype itself or as raw
// bytes in a uint8 tensor (what communication buffers hold). The format is always given
// explicitly (fp8_dtype); a tensor of an FP8 dtype must agree with it, so bytes are never
// reinterpreted as the other format by accident.
void check_fp8_data(const TensorRef& t, DType fp8_dtype, const char* op, const char* what);

// t is contiguous and has exactly this shape.
void check_shape(const TensorRef& t, const std::vector<std::int64_t>& shape, const char* op,
                 const char* what);

// t is a contiguous float32 tensor with `numel` elements (shape free: [1], [] or [n]).
void check_float32_elements(const TensorRef& t, std::int64_t numel, const char* op,
                            const char* what);

// All given tensors (nullptr entries are skipped) share one device; returns it (-1 for host
// memory, the ordinal for CUDA). Throws kInvalidArgument naming two that differ.
int require_one_device(const char* op, std::initializer_list<const TensorRef*> tensors);

// The error of a CUDA tensor in a build without CUDA support (kUnsupported, naming the op).
[[noreturn]] void throw_no_cuda(const char* op, const TensorRef& t);

// NOTE [scalar aliasing]: on CUDA every thread block reads the scale while one of them writes
// scale_inv, and an amax output is zeroed before the launch, so scale, scale_inv and amax
// must not share memory there (the host reference reads the scale first and tolerates it).
// Throws kInvalidArgument when the bytes of a and b (b may be nullptr) overlap.
void check_disjoint(const char* op, const TensorRef& a, const char* a_name, const TensorRef* b,
                    const char* b_name);

}  // namespace overlap::kernels

namespace overlap::kernels {

// The outputs of a block-scaled quantization; any entry may be nullptr. Rowwise data and its
// scale_inv are given together or not at all; likewise columnwise; at least one direction.
struct QuantizedOutputs {
  const TensorRef* rowwise_data = nullptr;
  const TensorRef* rowwise_scale_inv = nullptr;
  const TensorRef* columnwise_data = nullptr;
  const TensorRef* columnwise_scale_inv = nullptr;
};

// Checks the pairing rule above; returns {rowwise wanted, columnwise wanted}.
std::pair<bool, bool> check_output_pairs(const QuantizedOutputs& outs, const char* op);

}  // namespace overlap::kernels

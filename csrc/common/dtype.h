// Element types understood by the core. Torch-free: the binding layer maps framework dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace overlap {

enum class DType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat8E4M3 = 3,  // e4m3fn: no infinities, max 448
  kFloat8E5M2 = 4,  // max 57344
  kUInt8 = 5,       // raw bytes (also FP8 carried as bytes, E8M0 scales)
  kInt32 = 6,
  kFloat64 = 7,
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
bool dtype_is_fp8(DType dtype);

// Host conversions shared by every host reference (round to nearest even where narrowing).
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16(float value);

// NOTE [fp8 encoding]: every FP8 producer in the core (host references and CUDA kernels)
// encodes with round-to-nearest-even and SATURATES finite values and infinities beyond the
// format's largest finite value to +-max (448 for e4m3fn, 57344 for e5m2), like the
// __NV_SATFINITE conversions and like torch's cast applied after clamp(-max, max). Torch's
// own cast does not saturate (480 -> NaN in e4m3fn), which is why a plain .to() is not the
// reference. NaN stays NaN with its sign kept: 0x7F (or 0xFF) in both formats, as torch does.

// Largest finite value of an FP8 format; throws kInvalidArgument for non-FP8 dtypes.
float fp8_max_value(DType fp8_dtype);

// float -> FP8 bits (see NOTE [fp8 encoding]); fp8_dtype is kFloat8E4M3 or kFloat8E5M2.
std::uint8_t float_to_fp8(float value, DType fp8_dtype);

// FP8 bits -> float, exact.
float fp8_to_float(std::uint8_t bits, DType fp8_dtype);

// Writes `value` as element i of a buffer of float32, bfloat16 or float16 (host code only).
void store_from_float(void* data, DType dtype, std::size_t i, float value);

// Reads element i of a buffer of `dtype` as float (host code only; FP8 types included).
float load_as_float(const void* data, DType dtype, std::size_t i);

}  // namespace overlap

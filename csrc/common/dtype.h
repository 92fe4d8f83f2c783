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

// Reads element i of a buffer of `dtype` as float (host code only; FP8 types included).
float load_as_float(const void* data, DType dtype, std::size_t i);

}  // namespace overlap

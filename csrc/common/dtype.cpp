#include "common/dtype.h"

#include <cmath>
#include <cstring>

#include "common/errors.h"

namespace overlap {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kUInt8:
      return 1;
    case DType::kFloat64:
      return 8;
  }
  OVERLAP_THROW(kInternal, "unknown dtype " << static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat8E4M3:
      return "float8_e4m3fn";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool dtype_is_fp8(DType dtype) {
  return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2;
}

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  if (std::isnan(value)) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const std::uint32_t rounding_bias = 0x7FFF + ((u >> 16) & 1);                // nearest even
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1F;
  const std::uint32_t mant = h & 0x3FF;
  float magnitude;
  if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    magnitude =
        mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    magnitude = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  std::uint32_t u;
  std::memcpy(&u, &magnitude, sizeof(u));
  u |= sign;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

std::uint16_t float_to_fp16(float value) {
  std::uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  const float a = std::fabs(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7E00);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7C00);  // rounds to inf
  if (a < 6.103515625e-05f) {                                           // subnormal range
    // Units of 2^-24, round to nearest even.
    const float q = a * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(q)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: scale the mantissa to [1024, 2048) and round to nearest even.
  float q = std::nearbyint(m * 2048.0f);
  if (q >= 2048.0f) {
    q = 1024.0f;
    ++e;
  }
  const int biased = e - 1 + 15;
  if (biased >= 31) return static_cast<std::uint16_t>(sign | 0x7C00);
  return static_cast<std::uint16_t>(sign | (biased << 10) | (static_cast<int>(q) - 1024));
}

namespace {
// FP8 decoding, exact: e4m3fn (bias 7, no inf, S.1111.111 = NaN) and e5m2 (bias 15, IEEE-like).
float fp8_to_float(std::uint8_t bits, int exp_bits, int bias, bool has_inf) {
  const int mant_bits = 7 - exp_bits;
  const bool negative = bits & 0x80;
  const int exp = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  const int exp_max = (1 << exp_bits) - 1;
  float v;
  if (has_inf && exp == exp_max) {
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!has_inf && exp == exp_max && mant == (1 << mant_bits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<float>(mant | (1 << mant_bits)), exp - bias - mant_bits);
  }
  return negative ? -v : v;
}
}  // namespace

float load_as_float(const void* data, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kFloat64:
      return static_cast<float>(static_cast<const double*>(data)[i]);
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kFloat16:
      return fp16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kFloat8E4M3:
      return fp8_to_float(static_cast<const std::uint8_t*>(data)[i], 4, 7, false);
    case DType::kFloat8E5M2:
      return fp8_to_float(static_cast<const std::uint8_t*>(data)[i], 5, 15, true);
    case DType::kUInt8:
      return static_cast<float>(static_cast<const std::uint8_t*>(data)[i]);
    case DType::kInt32:
      return static_cast<float>(static_cast<const std::int32_t*>(data)[i]);
  }
  OVERLAP_THROW(kInternal, "unknown dtype " << static_cast<int>(dtype));
}

}  // namespace overlap

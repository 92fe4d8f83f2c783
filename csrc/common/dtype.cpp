#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

// Bit layout of one FP8 format. e4m3fn has no infinities and one NaN pattern per sign
// (S.1111.111), which makes 448 = S.1111.110 its largest finite value; e5m2 is IEEE-like.
struct Fp8Format {
  int mant_bits;
  int bias;
  bool has_inf;
  std::uint8_t max_bits;  // largest finite magnitude, sign bit clear
  float max_value;
};

constexpr Fp8Format kE4M3{3, 7, false, 0x7E, 448.0f};
constexpr Fp8Format kE5M2{2, 15, true, 0x7B, 57344.0f};

const Fp8Format& fp8_format(DType fp8_dtype) {
  if (fp8_dtype == DType::kFloat8E4M3) return kE4M3;
  if (fp8_dtype == DType::kFloat8E5M2) return kE5M2;
  OVERLAP_THROW(kInvalidArgument, "expected an FP8 format (float8_e4m3fn or float8_e5m2), got "
                                      << dtype_name(fp8_dtype));
}

// FP8 decoding, exact.
float decode_fp8(std::uint8_t bits, const Fp8Format& f) {
  const int exp_bits = 7 - f.mant_bits;
  const bool negative = bits & 0x80;
  const int exp = (bits >> f.mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << f.mant_bits) - 1);
  const int exp_max = (1 << exp_bits) - 1;
  float v;
  if (f.has_inf && exp == exp_max) {
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!f.has_inf && exp == exp_max && mant == (1 << f.mant_bits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(static_cast<float>(mant | (1 << f.mant_bits)), exp - f.bias - f.mant_bits);
  }
  return negative ? -v : v;
}

// NOTE [fp8 rounding]: with e the exponent of the value (never below the smallest normal
// exponent, so subnormals share the quantum of the first binade), q = rint(a * 2^(mant - e))
// is the significand in units of the last place, rounded to nearest even; the scaling by a
// power of two is exact, so this is the one and only rounding. The encoding is then
// ((e - min_exp) << mant) + q: q == 2^mant marks the implicit bit of a normal number, and a
// q that rounded up to 2^(mant+1) carries into the exponent field, which is exactly the next
// binade's encoding. Subnormals (e == min_exp, q < 2^mant) come out with exponent field 0.
std::uint8_t encode_fp8(float value, const Fp8Format& f) {
  std::uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80);
  if (std::isnan(value)) return static_cast<std::uint8_t>(sign | 0x7F);
  const float a = std::fabs(value);
  if (a > f.max_value) return static_cast<std::uint8_t>(sign | f.max_bits);  // saturate
  const int min_exp = 1 - f.bias;
  const int e = a == 0.0f ? min_exp : std::max(std::ilogb(a), min_exp);
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, f.mant_bits - e)));
  // a <= max_value and max_value is representable, so rounding never passes max_bits.
  return static_cast<std::uint8_t>(sign | (((e - min_exp) << f.mant_bits) + q));
}

}  // namespace

float fp8_max_value(DType fp8_dtype) {
  return fp8_format(fp8_dtype).max_value;
}

std::uint8_t float_to_fp8(float value, DType fp8_dtype) {
  return encode_fp8(value, fp8_format(fp8_dtype));
}

float fp8_to_float(std::uint8_t bits, DType fp8_dtype) {
  return decode_fp8(bits, fp8_format(fp8_dtype));
}

void store_from_float(void* data, DType dtype, std::size_t i, float value) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(data)[i] = value;
      return;
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(data)[i] = float_to_bf16(value);
      return;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(data)[i] = float_to_fp16(value);
      return;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      static_cast<std::uint8_t*>(data)[i] = float_to_fp8(value, dtype);
      return;
    default:
      OVERLAP_THROW(kInternal, "store_from_float: unsupported dtype " << dtype_name(dtype));
  }
}

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
      return decode_fp8(static_cast<const std::uint8_t*>(data)[i], kE4M3);
    case DType::kFloat8E5M2:
      return decode_fp8(static_cast<const std::uint8_t*>(data)[i], kE5M2);
    case DType::kUInt8:
      return static_cast<float>(static_cast<const std::uint8_t*>(data)[i]);
    case DType::kInt32:
      return static_cast<float>(static_cast<const std::int32_t*>(data)[i]);
  }
  OVERLAP_THROW(kInternal, "unknown dtype " << static_cast<int>(dtype));
}

}  // namespace overlap

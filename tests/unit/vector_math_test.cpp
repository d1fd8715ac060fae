// The vectorisable float32 functions of vector_math.h against float64 and LibTorch's conversions.

#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "myriad/util/vector_math.h"

namespace myriad {
namespace {

TEST(VectorMath, ExpIsWithinTwoUlpOverFloatsNormalRange) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-87.0f, 87.0f);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -1e-3f * static_cast<float>(i) : uniform(random);
    const double exact = std::exp(static_cast<double>(x));
    const double ulp =
        std::nextafter(static_cast<float>(exact), INFINITY) - static_cast<float>(exact);
    worst = std::max(worst, std::fabs(vector_exp(x) - exact) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(vector_exp(0.0f), 1.0f);
}

TEST(VectorMath, ExpOfTheSoftmaxsEdges) {
  // Far below the largest logit: negligible beside any sum that holds exp(0) = 1.
  EXPECT_LT(vector_exp(-1000.0f), 1e-37f);
  EXPECT_GE(vector_exp(-1000.0f), 0.0f);
  EXPECT_EQ(vector_exp(-std::numeric_limits<float>::infinity()), vector_exp(-87.3f));
  EXPECT_TRUE(std::isnan(vector_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_NEAR(vector_exp(88.0f) / std::exp(88.0), 1.0, 1e-6);
}

TEST(VectorMath, Bf16NearestMatchesLibTorchsRounding) {
  std::mt19937 random(11);
  const auto check = [](uint32_t bits) {
    const float v = bits_float(bits);
    const uint16_t ours = bf16_bits_nearest(v);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bits_float(static_cast<uint32_t>(ours) << 16))) << std::hex << bits;
    } else {
      EXPECT_EQ(ours, c10::BFloat16(v).x) << std::hex << bits;
    }
  };
  for (int i = 0; i < 1000000; ++i) check(static_cast<uint32_t>(random()));
  // Ties either way, the largest finite values, infinities, signed zeros and NaNs.
  for (uint32_t bits :
       {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x7F7FFFFFu, 0x7F7F8000u, 0x7F800000u, 0xFF800000u,
        0x00000000u, 0x80000000u, 0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x00008000u})
    check(bits);
}

}  // namespace
}  // namespace myriad

// The kernel prelude as a header of its own: it compiles first in a translation unit (so it includes
// what it uses), its math matches libm within the accuracy the generated kernels rely on, its
// maximum and minimum propagate NaN as ATen's do, and the text the plugin embeds is the header
// byte for byte.
#include "kernel_prelude.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>

#include "kernel_prelude_text.h"

namespace {

// The worst error of f against the double-precision reference over `n` random points of [lo, hi]
// (both ends included), relative to max(|reference|, floor).
template <class F, class R>
double worst_error(F f, R ref, float lo, float hi, double floor, int n = 200000) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(lo, hi);
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const float x = i == 0 ? lo : i == 1 ? hi : u(rng);
    const double r = ref(static_cast<double>(x));
    worst = std::max(worst, std::fabs(static_cast<double>(f(x)) - r) / std::max(std::fabs(r), floor));
  }
  return worst;
}

}  // namespace

TEST(InductorPrelude, FloatExpLogTanhAreWithinAFewUlpsOfLibm) {
  EXPECT_LT(worst_error([](float x) { return k_exp(x); }, [](double x) { return std::exp(x); }, -87.0f, 88.0f, 0),
            2e-7);
  // log over 74 decades, relative to max(|log x|, 1): absolute near x = 1, where log vanishes.
  EXPECT_LT(worst_error([](float x) { return k_log(std::pow(10.0f, x)); },
                        [](double x) { return std::log(static_cast<double>(std::pow(10.0f, static_cast<float>(x)))); },
                        -37.0f, 37.0f, 1.0),
            3e-7);
  EXPECT_LT(worst_error([](float x) { return k_tanh(x); }, [](double x) { return std::tanh(x); }, -10.0f, 10.0f, 1.0),
            1e-6);
}

TEST(InductorPrelude, ErfAndNormalCdfKeepTheirRelativeAccuracyInTheTails) {
  EXPECT_LT(worst_error([](float x) { return k_erf(x); }, [](double x) { return std::erf(x); }, -6.0f, 6.0f, 1e-30),
            5e-7);
  // Phi(-12) is 1.8e-33: the tail form keeps its digits, where 1 + erf(x / sqrt(2)) has none left.
  EXPECT_LT(worst_error([](float x) { return k_ndtr(x); },
                        [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }, -12.0f, 12.0f, 0),
            5e-5);
}

TEST(InductorPrelude, LogOfZeroNegativeInfiniteAndSubnormalInputs) {
  EXPECT_EQ(k_log(0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(k_log(-1.0f)));
  EXPECT_TRUE(std::isnan(k_log(std::nanf(""))));
  EXPECT_EQ(k_log(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_NEAR(k_log(1e-40f), std::log(static_cast<double>(1e-40f)), 1e-5);
}

TEST(InductorPrelude, MaximumAndMinimumPropagateNanFromEitherSide) {
  const float nan = std::nanf("");
  EXPECT_TRUE(std::isnan(k_max<float>(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(k_max<float>(1.0f, nan)));
  EXPECT_TRUE(std::isnan(k_min<double>(nan, 1.0)));
  EXPECT_TRUE(std::isnan(k_min<double>(1.0, nan)));
  EXPECT_EQ(k_max<float>(-2.0f, 3.0f), 3.0f);
  EXPECT_EQ(k_min<float>(-2.0f, 3.0f), -2.0f);
}

TEST(InductorPrelude, EmbeddedTextIsTheHeaderByteForByte) {
  std::ifstream f(KILN_INDUCTOR_PRELUDE_HEADER, std::ios::binary);
  ASSERT_TRUE(f) << KILN_INDUCTOR_PRELUDE_HEADER;
  const std::string header((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GT(header.size(), 1000u);
  EXPECT_EQ(std::string(kiln::inductor::kernel_prelude()), header);
}

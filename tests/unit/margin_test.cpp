#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "myriad/classifier/margin.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

MarginParams params(float m1, float m2, float m3, bool straight_through = false) {
  MarginParams p;
  p.scale = 64.0f;
  p.m1 = m1;
  p.m2 = m2;
  p.m3 = m3;
  p.straight_through = straight_through;
  return p;
}

double target_logit(double cosine, const MarginParams& p) {
  float z = 0, d = 0;
  margin_target(static_cast<float>(cosine), p, &z, &d);
  return z;
}

// The target logit must fall as the angle grows, over the whole of [0, pi], including where
// m1*theta + m2 passes pi (where plain cos(theta + m) would rise again).
TEST(Margin, TargetLogitIsMonotoneInTheAngle) {
  for (const MarginParams& p : {params(1, 0.5, 0), params(1.7, 0, 0), params(4, 0, 0),
                                params(1.35, 0.5, 0.2), params(1, 0, 0.4)}) {
    double previous = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= 2000; ++i) {
      const double theta = M_PI * i / 2000.0;
      const double z = target_logit(std::cos(theta), p);
      EXPECT_LE(z, previous + 1e-3) << "m1 " << p.m1 << " m2 " << p.m2 << " at theta " << theta;
      previous = z;
    }
  }
}

TEST(Margin, MatchesTheNamedFormulasWhereTheyApply) {
  const double c = std::cos(1.0);
  EXPECT_NEAR(target_logit(c, params(1, 0.5, 0)), 64 * std::cos(1.5), 1e-4);  // arcface
  EXPECT_NEAR(target_logit(c, params(1, 0, 0.4)), 64 * (c - 0.4), 1e-4);      // cosface
  EXPECT_NEAR(target_logit(c, params(1.5, 0, 0)), 64 * std::cos(1.5), 1e-4);  // sphereface, k = 0
  // theta + m2 > pi: the extension (-1)^k cos(theta + m2) - 2k with k = 1.
  const double theta = 3.0;
  EXPECT_NEAR(target_logit(std::cos(theta), params(1, 0.5, 0)), 64 * (-std::cos(theta + 0.5) - 2),
              1e-3);
}

TEST(Margin, ExactDerivativeMatchesFiniteDifferences) {
  for (const MarginParams& p : {params(1, 0.5, 0), params(1.7, 0, 0), params(1.35, 0.5, 0.2)}) {
    for (double theta : {0.3, 1.0, 1.9, 2.8}) {
      const double c = std::cos(theta);
      float z = 0, d = 0;
      margin_target(static_cast<float>(c), p, &z, &d);
      const double h = 1e-3;
      const double numeric = (target_logit(c + h, p) - target_logit(c - h, p)) / (2 * h);
      EXPECT_NEAR(d, numeric, 2e-3 * std::abs(numeric) + 0.05) << "theta " << theta;
    }
  }
}

TEST(Margin, StraightThroughAndEndpointsAreFinite) {
  float z = 0, d = 0;
  margin_target(0.3f, params(1, 0.5, 0, true), &z, &d);
  EXPECT_FLOAT_EQ(d, 64.0f);
  for (float c : {1.0f, -1.0f, 1.5f, -1.5f}) {
    margin_target(c, params(1, 0.5, 0), &z, &d);
    EXPECT_TRUE(std::isfinite(z) && std::isfinite(d)) << c;
  }
}

namespace po = boost::program_options;

MarginConfig parse(std::vector<std::string> args) {
  po::options_description options;
  add_margin_options(options);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  po::variables_map values;
  po::store(po::parse_command_line(static_cast<int>(argv.size()), argv.data(), options), values);
  po::notify(values);
  return margin_from_options(values);
}

TEST(MarginConfig, NamedMarginsTakeTheirOwnParameter) {
  const MarginConfig arc = parse({"--margin", "arcface", "--m2", "0.4"});
  EXPECT_EQ(arc.type, MarginType::kArcFace);
  EXPECT_DOUBLE_EQ(arc.m2, 0.4);
  EXPECT_DOUBLE_EQ(arc.scale, 64.0);
  EXPECT_DOUBLE_EQ(parse({"--margin", "cosface"}).m3, 0.4);
  EXPECT_DOUBLE_EQ(parse({"--margin", "sphereface", "--m1", "2"}).m1, 2.0);
  const MarginConfig combined =
      parse({"--margin", "combined", "--m1", "1.1", "--m2", "0.2", "--m3", "0.3", "--scale", "32"});
  EXPECT_DOUBLE_EQ(combined.m1, 1.1);
  EXPECT_DOUBLE_EQ(combined.scale, 32.0);
  EXPECT_TRUE(parse({"--margin-gradient", "straight-through"}).straight_through);
  EXPECT_FALSE(parse({"--margin", "softmax"}).params().normalized);
}

TEST(MarginConfig, RejectsMismatchedOrOutOfRangeParameters) {
  EXPECT_THROW(parse({"--margin", "arcface", "--m3", "0.2"}), UsageError);
  EXPECT_THROW(parse({"--margin", "softmax", "--scale", "30"}), UsageError);
  EXPECT_THROW(parse({"--margin", "bogus"}), UsageError);
  EXPECT_THROW(parse({"--margin", "combined", "--m1", "0.5"}), UsageError);
  EXPECT_THROW(parse({"--margin", "arcface", "--m2", "3.5"}), UsageError);
  EXPECT_THROW(parse({"--scale", "-1"}), UsageError);
  EXPECT_THROW(parse({"--margin-gradient", "approximate"}), UsageError);
}

}  // namespace
}  // namespace myriad

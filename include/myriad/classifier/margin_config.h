#pragma once

#include <boost/program_options.hpp>

#include <string>

#include "myriad/classifier/margin.h"

namespace myriad {

enum class MarginType { kSoftmax, kArcFace, kCosFace, kSphereFace, kCombined };

// The user's choice of margin loss (`--margin --scale --m1 --m2 --m3 --margin-gradient`).
struct MarginConfig {
  MarginType type = MarginType::kArcFace;
  double scale = 64.0;
  double m1 = 1.0;
  double m2 = 0.5;
  double m3 = 0.0;
  bool straight_through = false;

  MarginParams params() const;
  // "arcface(s=64, m2=0.5, exact gradient)"
  std::string describe() const;
};

// Adds --margin, --scale, --m1, --m2, --m3 and --margin-gradient to `options`.
void add_margin_options(boost::program_options::options_description& options);

// Reads the options added above. Each named margin takes only its own parameter (arcface: m2,
// cosface: m3, sphereface: m1; softmax: none, not even --scale); giving another is a UsageError
// that points to `combined`. Out-of-range values are UsageErrors too.
MarginConfig margin_from_options(const boost::program_options::variables_map& values);

}  // namespace myriad

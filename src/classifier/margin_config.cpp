#include "myriad/classifier/margin_config.h"

#include <cmath>

#include "myriad/util/cli.h"
#include "myriad/util/error.h"

namespace myriad {

namespace po = boost::program_options;

namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

MarginParams MarginConfig::params() const {
  MarginParams p;
  p.normalized = type != MarginType::kSoftmax;
  p.scale = p.normalized ? static_cast<float>(scale) : 1.0f;
  p.m1 = p.normalized ? static_cast<float>(m1) : 1.0f;
  p.m2 = p.normalized ? static_cast<float>(m2) : 0.0f;
  p.m3 = p.normalized ? static_cast<float>(m3) : 0.0f;
  p.straight_through = straight_through;
  return p;
}

std::string MarginConfig::describe() const {
  const char* gradient = straight_through ? "straight-through gradient" : "exact gradient";
  switch (type) {
    case MarginType::kSoftmax:
      return "softmax (no normalisation, no margin)";
    case MarginType::kArcFace:
      return str_format("arcface(s={}, m2={}, {})", scale, m2, gradient);
    case MarginType::kCosFace:
      return str_format("cosface(s={}, m3={})", scale, m3);
    case MarginType::kSphereFace:
      return str_format("sphereface(s={}, m1={}, {})", scale, m1, gradient);
    case MarginType::kCombined:
      return str_format("combined(s={}, m1={}, m2={}, m3={}, {})", scale, m1, m2, m3, gradient);
  }
  return "?";
}

void add_margin_options(po::options_description& options) {
  // clang-format off
  options.add_options()
      ("margin", po::value<std::string>()->default_value("arcface"), "margin loss: softmax, arcface, cosface (AM-softmax), sphereface or combined")
      ("scale", po::value<double>(), "logit scale s (default 64; not used by softmax)")
      ("m1", po::value<double>(), "multiplicative angular margin (sphereface default 1.7; combined default 1)")
      ("m2", po::value<double>(), "additive angular margin (arcface default 0.5; combined default 0)")
      ("m3", po::value<double>(), "additive cosine margin (cosface default 0.4; combined default 0)")
      ("margin-gradient", po::value<std::string>()->default_value("exact"), "exact, or straight-through (no gradient through the margin, as arcface_torch)");
  // clang-format on
}

namespace {

// Each --margin: its type, which of --m1, --m2, --m3 it takes (the others are rejected) and their
// defaults. Softmax takes no --scale either.
struct MarginForm {
  const char* name;
  MarginType type;
  bool takes[3];
  double defaults[3];
};

constexpr MarginForm kMarginForms[] = {
    {"softmax", MarginType::kSoftmax, {false, false, false}, {1.0, 0.0, 0.0}},
    {"arcface", MarginType::kArcFace, {false, true, false}, {1.0, 0.5, 0.0}},
    {"cosface", MarginType::kCosFace, {false, false, true}, {1.0, 0.0, 0.4}},
    {"am-softmax", MarginType::kCosFace, {false, false, true}, {1.0, 0.0, 0.4}},
    {"sphereface", MarginType::kSphereFace, {true, false, false}, {1.7, 0.0, 0.0}},
    {"combined", MarginType::kCombined, {true, true, true}, {1.0, 0.0, 0.0}},
};

const MarginForm& margin_form(const std::string& name) {
  for (const MarginForm& form : kMarginForms) {
    if (name == form.name) return form;
  }
  throw UsageError(
      str_format("unknown --margin '{}' (softmax, arcface, cosface, sphereface, combined)", name));
}

void check_margin(const MarginConfig& c) {
  if (!(c.scale > 0)) throw UsageError(str_format("--scale must be positive, got {}", c.scale));
  if (!(c.m1 >= 1.0)) throw UsageError(str_format("--m1 must be at least 1, got {}", c.m1));
  if (!(c.m2 >= 0.0 && c.m2 < kPi))
    throw UsageError(str_format("--m2 must be in [0, pi), got {}", c.m2));
  if (!(c.m3 >= 0.0 && c.m3 < 2.0))
    throw UsageError(str_format("--m3 must be in [0, 2), got {}", c.m3));
}

}  // namespace

MarginConfig margin_from_options(const po::variables_map& values) {
  const std::string name = values["margin"].as<std::string>();
  const MarginForm& form = margin_form(name);
  const auto given = [&](const char* key) { return option_given(values, key); };
  const auto reject = [&](const char* key) {
    if (!given(key)) return;
    throw UsageError(str_format(
        "--{} does not apply to --margin {}; use --margin combined to mix margins", key, name));
  };
  MarginConfig c;
  c.type = form.type;
  if (c.type == MarginType::kSoftmax) reject("scale");
  const char* keys[] = {"m1", "m2", "m3"};
  double* params[] = {&c.m1, &c.m2, &c.m3};
  for (int i = 0; i < 3; ++i) {
    if (!form.takes[i]) reject(keys[i]);
    *params[i] = given(keys[i]) ? values[keys[i]].as<double>() : form.defaults[i];
  }
  c.scale = c.type == MarginType::kSoftmax ? 1.0
            : given("scale")               ? values["scale"].as<double>()
                                           : 64.0;
  const std::string gradient = values["margin-gradient"].as<std::string>();
  if (gradient != "exact" && gradient != "straight-through") {
    throw UsageError(
        str_format("--margin-gradient must be exact or straight-through, got '{}'", gradient));
  }
  c.straight_through = gradient == "straight-through";
  check_margin(c);
  return c;
}

}  // namespace myriad

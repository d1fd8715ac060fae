// insightface's IJB meta files (face/template, landmarks, template pairs): the input is the three
// texts, separated by NUL bytes, read together by read_ijb_meta as from-ijb reads them.

#include <array>
#include <cmath>
#include <filesystem>
#include <unordered_set>

#include "fuzz_input.h"
#include "myriad/data/ijb_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string input(reinterpret_cast<const char*>(data), size);
  // The three texts: the input cut at NUL bytes, parts beyond it empty.
  std::array<std::string, 3> texts;
  for (size_t k = 0, at = 0; k < texts.size() && at <= input.size(); ++k) {
    const size_t end = std::min(input.find('\0', at), input.size());
    texts[k] = input.substr(at, end - at);
    at = end + 1;
  }
  const std::string root = fuzz::scratch_directory();
  std::filesystem::create_directories(root + "/meta");
  std::filesystem::create_directories(root + "/loose_crop");
  const IjbLayout layout = ijb_layout(root, IjbTarget::kIjbc);
  fuzz::write_file(layout.faces, texts[0]);
  fuzz::write_file(layout.landmarks, texts[1]);
  fuzz::write_file(layout.pairs, texts[2]);
  fuzz::expect_clean([&] {
    const IjbMeta m = read_ijb_meta(layout);
    // What from-ijb relies on once the files are accepted.
    const size_t n = m.faces.images.size();
    if (n == 0 || m.landmarks.images != m.faces.images || m.landmarks.points.size() != n ||
        m.landmarks.scores.size() != n || m.faces.templates.size() != n ||
        m.faces.medias.size() != n || m.pairs.templates.size() != 2 * m.pairs.labels.size()) {
      __builtin_trap();
    }
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(m.landmarks.scores[i])) __builtin_trap();
      for (const Point& p : m.landmarks.points[i])
        if (!std::isfinite(p.x) || !std::isfinite(p.y)) __builtin_trap();
    }
    const std::unordered_set<int64_t> templates(m.faces.templates.begin(), m.faces.templates.end());
    for (int64_t t : m.pairs.templates)
      if (templates.count(t) == 0) __builtin_trap();
    for (uint8_t label : m.pairs.labels)
      if (label > 1) __builtin_trap();
  });
  return 0;
}

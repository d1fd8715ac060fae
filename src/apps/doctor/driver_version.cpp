#include "driver_version.h"

#include <cctype>
#include <sstream>

namespace myriad {

namespace {

bool is_version(const std::string& word) {
  if (word.empty() || !std::isdigit(static_cast<unsigned char>(word.front()))) return false;
  bool dot = false;
  for (const char c : word) {
    if (c == '.') {
      dot = true;
    } else if (!std::isdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return dot && word.back() != '.';
}

}  // namespace

std::string driver_version_from_proc(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("NVRM version:", 0) != 0) continue;
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      if (is_version(word)) return word;
    }
  }
  return "";
}

}  // namespace myriad

// HDF5 checks for the end-to-end tests, so that they need no hdf5-tools (GPU nodes lack them):
//   h5check equal A.h5 B.h5 DATASET [--rows-a BEGIN:COUNT] [--rows-b BEGIN:COUNT] [--delta D]
//       exit 0 when the datasets (or the row ranges) are equal: numeric within an absolute D
//       (default 0), byte strings exactly; otherwise print the first difference and exit 1
//   h5check shape FILE DATASET    prints the dimensions, "37x32"
//   h5check values FILE DATASET   prints a numeric dataset's values, space-separated

#include <cstdio>
#include <string>
#include <vector>

#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"

namespace {

using myriad::Hdf5File;

struct Rows {
  int64_t begin = 0;
  int64_t count = -1;  // -1: all
};

Rows parse_rows(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) throw std::runtime_error("rows must be BEGIN:COUNT, not " + text);
  return {std::stoll(text.substr(0, colon)), std::stoll(text.substr(colon + 1))};
}

int64_t row_count(const Hdf5File& file, const std::string& dataset, const Rows& rows) {
  return rows.count >= 0 ? rows.count : file.shape(dataset).at(0);
}

int compare(const std::string& a_path, const std::string& b_path, const std::string& dataset,
            const Rows& a_rows, const Rows& b_rows, double delta) {
  const Hdf5File a(a_path, Hdf5File::Mode::kRead), b(b_path, Hdf5File::Mode::kRead);
  if (a.is_bytes(dataset) != b.is_bytes(dataset)) {
    std::printf("%s: byte strings in one file only\n", dataset.c_str());
    return 1;
  }
  const bool whole = a_rows.count < 0 && b_rows.count < 0;
  if (whole && a.shape(dataset) != b.shape(dataset)) {
    std::printf("%s: shapes differ\n", dataset.c_str());
    return 1;
  }
  if (a.is_bytes(dataset)) {
    const int64_t na = row_count(a, dataset, a_rows), nb = row_count(b, dataset, b_rows);
    if (na != nb) {
      std::printf("%s: %lld rows against %lld\n", dataset.c_str(), static_cast<long long>(na),
                  static_cast<long long>(nb));
      return 1;
    }
    const auto x = a.read_bytes(dataset, a_rows.begin, na);
    const auto y = b.read_bytes(dataset, b_rows.begin, nb);
    for (int64_t i = 0; i < na; ++i) {
      if (x[i] != y[i]) {
        std::printf("%s: row %lld differs (%zu and %zu bytes)\n", dataset.c_str(),
                    static_cast<long long>(i), x[i].size(), y[i].size());
        return 1;
      }
    }
    return 0;
  }
  const torch::Tensor x =
      (whole ? a.read(dataset) : a.read_rows(dataset, a_rows.begin, row_count(a, dataset, a_rows)))
          .to(torch::kFloat64);
  const torch::Tensor y =
      (whole ? b.read(dataset) : b.read_rows(dataset, b_rows.begin, row_count(b, dataset, b_rows)))
          .to(torch::kFloat64);
  if (x.sizes() != y.sizes()) {
    std::printf("%s: the compared rows have different shapes\n", dataset.c_str());
    return 1;
  }
  const double worst = x.numel() == 0 ? 0.0 : (x - y).abs().max().item<double>();
  if (worst > delta) {
    std::printf("%s: largest difference %.9g exceeds %.9g\n", dataset.c_str(), worst, delta);
    return 1;
  }
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.size() >= 3 && args[0] == "shape") {
    const std::vector<int64_t> shape = Hdf5File(args[1], Hdf5File::Mode::kRead).shape(args[2]);
    for (size_t i = 0; i < shape.size(); ++i)
      std::printf("%s%lld", i ? "x" : "", static_cast<long long>(shape[i]));
    std::printf("\n");
    return 0;
  }
  if (args.size() >= 3 && args[0] == "values") {
    const torch::Tensor v =
        Hdf5File(args[1], Hdf5File::Mode::kRead).read(args[2]).to(torch::kFloat64).reshape(-1);
    for (int64_t i = 0; i < v.numel(); ++i)
      std::printf("%s%.9g", i ? " " : "", v[i].item<double>());
    std::printf("\n");
    return 0;
  }
  if (args.size() >= 4 && args[0] == "equal") {
    Rows a_rows, b_rows;
    double delta = 0.0;
    for (size_t i = 4; i + 1 < args.size(); i += 2) {
      if (args[i] == "--rows-a")
        a_rows = parse_rows(args[i + 1]);
      else if (args[i] == "--rows-b")
        b_rows = parse_rows(args[i + 1]);
      else if (args[i] == "--delta")
        delta = std::stod(args[i + 1]);
      else
        throw std::runtime_error("unknown option " + args[i]);
    }
    return compare(args[1], args[2], args[3], a_rows, b_rows, delta);
  }
  std::fprintf(
      stderr,
      "usage: h5check equal A B DATASET [options] | shape FILE DATASET | values FILE DATASET\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const myriad::Error& e) {
    std::fprintf(stderr, "h5check: %s\n", e.message().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h5check: %s\n", e.what());
  }
  return 2;
}

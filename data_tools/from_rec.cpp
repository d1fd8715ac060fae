// myriad-data from-rec: an insightface MXNet RecordIO dataset (train.rec + train.idx of MS1MV2,
// MS1MV3, Glint360K, WebFace...) into an HDF5 dataset of the unchanged JPEG bytes and labels, or
// with --resize of the images resized and stored again.
//
// insightface layout: record 0 is a header whose labels are (first identity record, end of the
// identity records); records 1 .. first-1 are the images, each with its class as label; the
// identity records (one per class) follow. Without such a header every indexed record is an
// image and the classes are counted from the labels.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/image_recoder.h"
#include "myriad/data/recordio.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"
#include "recode_options.h"

namespace myriad {

namespace {

constexpr int64_t kBlockRecords = 4096;
constexpr int kReportedBadRecords = 10;

// The image keys and class count the dataset's header (record 0) declares, if it has one.
struct Layout {
  std::vector<int64_t> images;
  int64_t num_classes = 0;  // 0: count from the labels
};

Layout read_layout(const RecordIoReader& reader, bool skip_missing, int64_t& missing) {
  Layout layout;
  if (reader.has(0)) {
    const ImageRecord header =
        parse_image_record(reader.read(0), str_format("record 0 (header) of '{}'", reader.path()));
    if (header.labels.size() >= 2) {
      const int64_t first_identity = static_cast<int64_t>(header.labels[0]);
      const int64_t end = static_cast<int64_t>(header.labels[1]);
      MYRIAD_CHECK(first_identity >= 1 && end >= first_identity,
                   "record 0 (header) of '{}' is corrupt: image range [1, {}) and identity range "
                   "[{}, {})",
                   reader.path(), first_identity, first_identity, end);
      layout.num_classes = end - first_identity;
      for (int64_t key = 1; key < first_identity; ++key) {
        if (reader.has(key)) {
          layout.images.push_back(key);
        } else {
          MYRIAD_CHECK(skip_missing,
                       "record {} of '{}' is missing from the index (--skip-bad skips it)", key,
                       reader.path());
          ++missing;
        }
      }
      return layout;
    }
  }
  layout.images = reader.keys();
  return layout;
}

// One converted record, or why it was rejected.
struct Converted {
  std::string what;  // "record K of 'FILE'"
  std::string image;
  int64_t label = -1;
  ImageShape shape;
  std::string error;
};

Converted convert(const RecordIoReader& reader, int64_t key, int64_t num_classes,
                  const ImageRecoder& recoder) {
  Converted c;
  c.what = str_format("record {} of '{}'", key, reader.path());
  const std::string& what = c.what;
  try {
    ImageRecord record = parse_image_record(reader.read(key), what);
    const float label = record.labels.at(0);
    MYRIAD_CHECK(
        label >= 0 && label == std::floor(label) && (num_classes == 0 || label < num_classes),
        "{} has label {}, not a class in [0, {})", what, label,
        num_classes > 0 ? str_format("{}", num_classes) : std::string("inf"));
    c.shape = decode_image_header(record.image, what);
    c.label = static_cast<int64_t>(label);
    c.image = recoder.recode(std::move(record.image), c.shape, nullptr, what);
  } catch (const Error& e) {
    c.error = e.message();
  }
  return c;
}

// The command line.
struct FromRecOptions {
  std::string rec, idx, output;
  int workers = 0, channels = 3;
  bool skip_bad = false;
  RecodeOptions recode;
};

// `argv` into `o`, checked, with the defaults that depend on others filled in; false where it
// asked for help only.
bool parse_from_rec_options(const ProcessContext& context, int argc, char** argv,
                            FromRecOptions& o) {
  po::options_description options("from-rec options");
  RecodeText recode;
  // clang-format off
  options.add_options()
      ("rec", po::value(&o.rec)->required(), "MXNet RecordIO file (train.rec)")
      ("idx", po::value(&o.idx), "its index (default: the .rec path with .idx)")
      ("output", po::value(&o.output)->required(), "HDF5 file to write")
      ("channels", po::value(&o.channels)->default_value(o.channels), "channels the images decode to: 3 (RGB) or 1")
      ("skip-bad", po::bool_switch(&o.skip_bad), "skip (and count) corrupt or truncated records instead of stopping")
      ("workers", po::value(&o.workers)->default_value(0), "threads reading, checking and converting records (0: all cores)");
  // clang-format on
  add_recode_options(options, recode);
  po::variables_map values;
  if (!parse_command_line(
          argc, argv, options, values,
          "usage: myriad-data from-rec --rec train.rec [--idx train.idx] --output X.h5",
          context.rank())) {
    return false;
  }
  if (o.channels != 1 && o.channels != 3) throw UsageError("--channels must be 1 or 3");
  o.recode = parse_recode_options(values, recode, /*align=*/false, o.channels);
  if (o.workers <= 0)
    o.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.idx.empty()) o.idx = std::filesystem::path(o.rec).replace_extension(".idx").string();
  return true;
}

// The output as the records stream in: created at the first good record, whose image size every
// other must have where the bytes are kept.
struct Conversion {
  std::unique_ptr<Hdf5ImageWriter> writer;
  ImageShape first;
  int64_t written = 0, max_label = -1;
  int64_t bad = 0;  // records missing from the index or rejected
};

// Writes the good records of `block` (skipping and counting the bad ones with --skip-bad).
void write_block(std::vector<Converted>& block, const FromRecOptions& o, const Layout& layout,
                 const ImageRecoder& recoder, Conversion& out) {
  std::vector<std::string> images;
  std::vector<int64_t> labels;
  for (Converted& c : block) {
    if (c.error.empty() && out.writer != nullptr && !recoder.decodes() &&
        (c.shape.height != out.first.height || c.shape.width != out.first.width)) {
      c.error = str_format("{} holds a {}x{} image; the dataset's are {}x{}", c.what,
                           c.shape.height, c.shape.width, out.first.height, out.first.width);
    }
    if (!c.error.empty()) {
      MYRIAD_CHECK(o.skip_bad, "{} (--skip-bad skips bad records)", c.error);
      if (out.bad++ < kReportedBadRecords) log_warn("skipping {}", c.error);
      continue;
    }
    if (out.writer == nullptr) {
      out.first = recoder.stored_shape(c.shape);
      // Sized for every record; finish() drops the rows of skipped ones.
      out.writer = std::make_unique<Hdf5ImageWriter>(
          o.output, static_cast<int64_t>(layout.images.size()), out.first.height, out.first.width,
          out.first.channels, /*encoded=*/!recoder.raw(),
          layout.num_classes > 0 ? layout.num_classes : 1);
    }
    out.max_label = std::max(out.max_label, c.label);
    images.push_back(std::move(c.image));
    labels.push_back(c.label);
  }
  if (!images.empty()) {
    recoder.write(*out.writer, out.written, images);
    out.writer->write_labels(out.written, labels);
    out.written += static_cast<int64_t>(images.size());
  }
}

// Converts every image record of `layout` into `out`, a block at a time on `o.workers` threads.
void convert_all(const RecordIoReader& reader, const Layout& layout, const FromRecOptions& o,
                 const ImageRecoder& recoder, Conversion& out) {
  const int64_t n = static_cast<int64_t>(layout.images.size());
  ProgressBar progress("converting", n);
  const int64_t block_records = recoder.block_images(kBlockRecords);
  for (int64_t begin = 0; begin < n; begin += block_records) {
    const int64_t count = std::min(block_records, n - begin);
    std::vector<Converted> block(static_cast<size_t>(count));
    parallel_for(count, o.workers, [&](int64_t i) {
      block[i] = convert(reader, layout.images[begin + i], layout.num_classes, recoder);
    });
    write_block(block, o, layout, recoder, out);
    progress.advance(count);
  }
  progress.finish();
}

}  // namespace

int run_from_rec(ProcessContext& context, int argc, char** argv) {
  FromRecOptions o;
  if (!parse_from_rec_options(context, argc, argv, o)) return kExitOk;
  const auto start = std::chrono::steady_clock::now();
  const RecordIoReader reader(o.rec, o.idx);
  Conversion out;
  const Layout layout = read_layout(reader, o.skip_bad, out.bad);
  const int64_t n = static_cast<int64_t>(layout.images.size());
  MYRIAD_CHECK(n > 0, "'{}' holds no image records", o.rec);
  log_info("{}: {} image records{}", o.rec, n,
           layout.num_classes > 0
               ? str_format(", {} identities (insightface header)", layout.num_classes)
               : std::string(", no header: classes counted from the labels"));
  const ImageRecoder recoder(o.recode);
  convert_all(reader, layout, o, recoder, out);
  MYRIAD_CHECK(out.writer != nullptr, "every record of '{}' is bad", o.rec);
  const int64_t num_classes = layout.num_classes > 0 ? layout.num_classes : out.max_label + 1;
  out.writer->set_attribute("source", o.rec);
  out.writer->set_attribute("num_classes", num_classes);
  if (recoder.decodes()) out.writer->set_attribute("preprocessing", recoder.describe());
  out.writer->finish(out.written);
  log_info("wrote {}: {} images {}x{}x{} ({}), {} classes{}; {:.0f} images/s", o.output,
           out.written, out.first.height, out.first.width, out.first.channels, recoder.describe(),
           num_classes,
           out.bad > 0 ? str_format(", {} bad records skipped", out.bad) : std::string(),
           out.written / seconds_since(start));
  return kExitOk;
}

}  // namespace myriad

// myriad-ckpt: inspects and converts sharded checkpoints (docs/checkpoint-format.md).

#include <cstdio>
#include <filesystem>
#include <optional>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/offline_tools.h"
#include "myriad/comm/entry.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

struct Arguments {
  std::string checkpoint;  // a checkpoint directory (resolved by checkpoint_of)
  std::string output;
};

// Parses CHECKPOINT, --output (described by `output_help` unless null) and the sub-command's own
// `extra` options. Nothing when only help was asked for.
std::optional<Arguments> parse(int argc, char** argv, const std::string& title,
                               const po::options_description& extra, const char* output_help,
                               const std::string& usage, const ProcessContext& context) {
  Arguments args;
  po::options_description options(title);
  options.add_options()("checkpoint", po::value(&args.checkpoint)->required(),
                        "checkpoint directory (or a directory of them)");
  if (output_help != nullptr)
    options.add_options()("output", po::value(&args.output)->required(), output_help);
  for (const auto& option : extra.options()) options.add(option);
  po::positional_options_description positional;
  positional.add("checkpoint", 1);
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values, usage, context.rank(), &positional))
    return std::nullopt;
  args.checkpoint = resolve_checkpoint(args.checkpoint);
  return args;
}

int run_inspect(ProcessContext& context, int argc, char** argv) {
  const auto args = parse(argc, argv, "inspect options", {}, nullptr,
                          "usage: myriad-ckpt inspect CHECKPOINT", context);
  if (!args) return kExitOk;
  const std::string& directory = args->checkpoint;
  const Manifest m = read_manifest(directory);
  std::printf("checkpoint  %s\n", directory.c_str());
  std::printf("step        %lld (next batch: epoch %lld, offset %lld)\n",
              static_cast<long long>(m.step), static_cast<long long>(m.position.epoch),
              static_cast<long long>(m.position.offset));
  std::printf("created     %s\n", m.created.c_str());
  std::printf("classifier  %lld classes x %lld, %d shards\n", static_cast<long long>(m.num_classes),
              static_cast<long long>(m.embedding_size), m.world_size);
  for (const ShardEntry& s : m.shards) {
    std::printf("  %-22s rank %-4d classes [%lld, %lld)\n", s.file.c_str(), s.rank,
                static_cast<long long>(s.class_offset),
                static_cast<long long>(s.class_offset + s.rows));
  }
  int bad = 0;
  std::printf("files\n");
  for (const auto& [name, entry] : m.files) {
    std::string status = "ok";
    try {
      verify_checkpoint(directory, {name});
    } catch (const Error& e) {
      status = "BAD: " + e.message();
      ++bad;
    }
    std::printf("  %-22s %12lld bytes  crc32 %s  %s\n", name.c_str(),
                static_cast<long long>(entry.bytes), crc32_hex(entry.crc32).c_str(),
                status.c_str());
  }
  MYRIAD_CHECK(bad == 0, "{} file(s) of '{}' fail verification", bad, directory);
  return kExitOk;
}

int run_export_backbone(ProcessContext& context, int argc, char** argv) {
  std::string format = "state-dict";
  po::options_description extra;
  extra.add_options()("format", po::value(&format)->default_value(format),
                      "state-dict (for torch.load and arcface_torch) or onnx (the inference graph, "
                      "for onnxruntime, OpenCV and insightface)");
  const auto args = parse(
      argc, argv, "export-backbone options", extra,
      "file to write: the backbone's state dict under insightface's names, or its ONNX graph",
      "usage: myriad-ckpt export-backbone CHECKPOINT --output backbone.pt [--format onnx]",
      context);
  if (args) export_backbone(args->checkpoint, args->output, parse_backbone_format(format));
  return kExitOk;
}

int run_merge_classifier(ProcessContext& context, int argc, char** argv) {
  const auto args =
      parse(argc, argv, "merge-classifier options", {}, "HDF5 file with /weight [C, D]",
            "usage: myriad-ckpt merge-classifier CHECKPOINT --output classifier.h5", context);
  if (args) merge_classifier(args->checkpoint, args->output);
  return kExitOk;
}

int run_reshard(ProcessContext& context, int argc, char** argv) {
  int world = 0;
  po::options_description extra;
  extra.add_options()("world-size", po::value(&world)->required(),
                      "number of ranks to split the classifier for");
  const auto args =
      parse(argc, argv, "reshard options", extra, "new checkpoint directory",
            "usage: myriad-ckpt reshard CHECKPOINT --world-size N --output DIR", context);
  if (!args) return kExitOk;
  if (world < 1) throw UsageError("--world-size must be positive");
  reshard_checkpoint(args->checkpoint, args->output, world);
  return kExitOk;
}

}  // namespace

}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    return myriad::run_sub_command(
        context, argc, argv,
        "usage: myriad-ckpt <command> CHECKPOINT [options]   (docs/checkpoint-format.md)",
        {{"inspect", "manifest, shards, sizes, and whether every checksum is valid",
          myriad::run_inspect},
         {"export-backbone",
          "the backbone's state dict for torch.load and arcface_torch's load_state_dict, or its "
          "ONNX graph (--format onnx)",
          myriad::run_export_backbone},
         {"merge-classifier", "all classifier shards as one HDF5 [C, D]",
          myriad::run_merge_classifier},
         {"reshard", "split the classifier for another number of ranks", myriad::run_reshard}});
  });
}

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "myriad/model/batch_norm.h"
#include "myriad/optim/lr_schedule.h"
#include "myriad/train/train_config.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

// Parses a myriad-train command line the way the executable does.
TrainConfig parse(std::vector<std::string> args, std::string* ini = nullptr) {
  args.insert(args.begin(), "myriad-train");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TrainConfig config;
  const auto options = train_options(config);
  po::variables_map values;
  parse_command_line_and_config(static_cast<int>(argv.size()), argv.data(), options, values,
                                "usage", 1, "config");
  finish_train_config(values, config);
  if (ini != nullptr) *ini = config_as_ini(values);
  return config;
}

TEST(TrainConfig, DefaultsAndOverrides) {
  const TrainConfig c =
      parse({"--backbone", "smallcnn", "--input-shape", "1x28x28", "--batch-size", "64",
             "--precision", "bf16", "--margin", "cosface", "--eval-pairs", "a.h5", "b.h5"});
  EXPECT_EQ(c.backbone, "smallcnn");
  EXPECT_EQ(c.input.channels, 1);
  EXPECT_EQ(c.input.height, 28);
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_EQ(c.precision, Precision::kBf16);
  EXPECT_EQ(c.margin.type, MarginType::kCosFace);
  EXPECT_EQ(c.eval_pairs, (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_DOUBLE_EQ(c.classifier_lr, c.lr);
  EXPECT_DOUBLE_EQ(c.classifier_weight_decay, c.weight_decay);
  EXPECT_EQ(c.bucket_bytes, int64_t{25} << 20);
  EXPECT_TRUE(c.random_flip);
  EXPECT_FALSE(c.deterministic);
  EXPECT_TRUE(parse({"--deterministic"}).deterministic);
  EXPECT_EQ(c.classifier_weight_dtype, torch::kFloat32);
  EXPECT_EQ(parse({"--classifier-weight-dtype", "bf16"}).classifier_weight_dtype, torch::kBFloat16);
}

TEST(TrainConfig, BadValuesAreUsageErrors) {
  const std::vector<std::vector<std::string>> bad = {{"--precision", "fp8"},
                                                     {"--backbone", "resnet9000"},
                                                     {"--input-shape", "3x112"},
                                                     {"--batch-size", "0"},
                                                     {"--lr-schedule", "step"},
                                                     {"--lr-schedule", "linear"},
                                                     {"--sample-rate", "1.5"},
                                                     {"--optimizer", "lamb"},
                                                     {"--bucket-size", "lots"},
                                                     {"--lr-steps", "100,50"},
                                                     {"--momentum", "1.0"},
                                                     {"--unknown-option", "1"},
                                                     {"--epochs", "many"},
                                                     {"--device", "tpu"},
                                                     {"--margin", "arcface", "--m3", "0.1"},
                                                     {"--num-classes", "10X"},
                                                     {"--max-steps", "99999999999G"},
                                                     {"--hang-timeout", "-1"},
                                                     {"--grad-comm-dtype", "int8"},
                                                     {"--classifier-weight-dtype", "fp16"},
                                                     {"--classifier-state-dtype", "fp16"}};
  for (const auto& args : bad) {
    EXPECT_THROW(parse(args), UsageError) << args[0];
  }
}

// The interleaved schedule's shape is checked where it is given, each error naming what to
// change; its --virtual-stages reads back from config.ini, and the default that config.ini
// writes under any other schedule is no error when a run resumes from it.
TEST(TrainConfig, InterleavedShapesAreChecked) {
  const std::map<std::string, std::vector<std::string>> bad = {
      {"--virtual-stages needs --pipeline-schedule interleaved",
       {"--pipeline-stages", "2", "--virtual-stages", "3"}},
      {"--pipeline-schedule interleaved needs --pipeline-stages 2 or more",
       {"--pipeline-schedule", "interleaved"}},
      {"--virtual-stages must be 2 or more",
       {"--pipeline-schedule", "interleaved", "--pipeline-stages", "2", "--micro-batches", "2",
        "--virtual-stages", "1"}},
      {"--pipeline-schedule interleaved runs the micro-batches in groups of one per stage: "
       "--micro-batches 4 is not a multiple of --pipeline-stages 3",
       {"--pipeline-schedule", "interleaved", "--pipeline-stages", "3", "--micro-batches", "4"}},
      {"--cuda-graphs on and --pipeline-schedule interleaved exclude each other (a stage's chunks "
       "are not recorded)",
       {"--pipeline-schedule", "interleaved", "--pipeline-stages", "2", "--micro-batches", "2",
        "--cuda-graphs", "on"}},
  };
  for (const auto& [message, args] : bad) {
    try {
      parse(args);
      ADD_FAILURE() << message << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(e.message(), message);
    }
  }
  std::string ini;
  const TrainConfig c = parse({"--pipeline-schedule", "interleaved", "--pipeline-stages", "4",
                               "--micro-batches", "8", "--virtual-stages", "3"},
                              &ini);
  EXPECT_EQ(c.virtual_stages, 3);
  EXPECT_EQ(train_config_from_ini(ini, "config.ini").virtual_stages, 3);
  parse({"--pipeline-stages", "2"}, &ini);
  EXPECT_NE(ini.find("virtual-stages = 2\n"), std::string::npos) << ini;
  EXPECT_NO_THROW(train_config_from_ini(ini, "config.ini"));
}

// Counts take size suffixes in myriad-train as in myriad-bench; a saved configuration keeps the
// number.
TEST(TrainConfig, CountsTakeSizeSuffixes) {
  std::string ini;
  const TrainConfig c = parse({"--num-classes", "10M", "--batch-size", "1K", "--max-steps", "2k",
                               "--synthetic-size", "3G", "--checkpoint-every", "500"},
                              &ini);
  EXPECT_EQ(c.num_classes, 10000000);
  EXPECT_EQ(c.batch_size, 1000);
  EXPECT_EQ(c.max_steps, 2000);
  EXPECT_EQ(c.synthetic_size, 3000000000);
  EXPECT_EQ(c.checkpoint_every, 500);
  EXPECT_NE(ini.find("num-classes = 10000000\n"), std::string::npos) << ini;
}

// --help shows defaults as a user writes them.
TEST(TrainConfig, HelpPrintsDefaultsAsWritten) {
  TrainConfig config;
  std::ostringstream help;
  help << train_options(config);
  for (const char* expected : {"(=0.1)", "(=0.0005)", "(=0.9)", "(=600)", "(=auto)", "(=fp32)"})
    EXPECT_NE(help.str().find(expected), std::string::npos) << expected << " in\n" << help.str();
  EXPECT_EQ(help.str().find("0000000"), std::string::npos) << help.str();
}

// A choice of each option that names one, as its option and config.ini spell it.
struct ChoiceOption {
  std::string option;
  std::vector<std::string> spellings;
  std::function<std::string(const TrainConfig&)> parsed;
};

std::vector<ChoiceOption> choice_options() {
  return {
      {"precision",
       {"auto", "fp32", "bf16", "fp16"},
       [](const TrainConfig& c) { return to_string(c.precision); }},
      {"channels-last",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.channels_last); }},
      {"cuda-graphs",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.cuda_graphs); }},
      {"pipeline-schedule",
       {"auto", "gpipe", "1f1b", "interleaved"},
       [](const TrainConfig& c) { return to_string(c.pipeline_schedule); }},
      {"optimizer", {"sgd", "adamw"}, [](const TrainConfig& c) { return to_string(c.optimizer); }},
      {"lr-schedule",
       {"poly", "cosine", "step"},
       [](const TrainConfig& c) { return to_string(c.lr_schedule); }},
      {"device", {"auto", "cpu", "cuda"}, [](const TrainConfig& c) { return to_string(c.device); }},
      {"grad-comm-dtype",
       {"fp32", "bf16", "fp16"},
       [](const TrainConfig& c) { return float_dtype_name(c.grad_comm_dtype); }},
      {"classifier-state-dtype",
       {"fp32", "bf16"},
       [](const TrainConfig& c) { return float_dtype_name(c.classifier_state_dtype); }},
      {"classifier-weight-dtype",
       {"fp32", "bf16"},
       [](const TrainConfig& c) { return float_dtype_name(c.classifier_weight_dtype); }},
      {"fused-classifier",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.fused_classifier); }},
      {"fused-update",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.fused_update); }},
      {"cudnn-benchmark",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.cudnn_benchmark); }},
      {"conv-statistics",
       {"auto", "on", "off"},
       [](const TrainConfig& c) { return to_string(c.conv_statistics); }},
  };
}

// Each spelling parses to the value that is named back by the same spelling, in config.ini too,
// which reads back to the same value.
TEST(TrainConfig, ChoicesRoundTrip) {
  for (const ChoiceOption& o : choice_options()) {
    for (const std::string& spelling : o.spellings) {
      SCOPED_TRACE("--" + o.option + " " + spelling);
      std::string ini;
      // --lr-steps: what --lr-schedule step needs; stages and micro-batches, what interleaved
      // needs.
      const TrainConfig c = parse({"--" + o.option, spelling, "--lr-steps", "10",
                                   "--pipeline-stages", "2", "--micro-batches", "2"},
                                  &ini);
      EXPECT_EQ(o.parsed(c), spelling);
      EXPECT_NE(ini.find(o.option + " = " + spelling + "\n"), std::string::npos) << ini;
      EXPECT_EQ(o.parsed(train_config_from_ini(ini, "config.ini")), spelling);
    }
  }
}

// A value outside an option's choices is a UsageError that names the option and its choices.
TEST(TrainConfig, BadChoicesNameTheOption) {
  const std::map<std::string, std::string> expected = {
      {"precision", "--precision must be auto, fp32, bf16 or fp16, got 'x'"},
      {"channels-last", "--channels-last must be auto, on or off, got 'x'"},
      {"cuda-graphs", "--cuda-graphs must be auto, on or off, got 'x'"},
      {"pipeline-schedule",
       "--pipeline-schedule must be auto, gpipe, 1f1b or interleaved, got 'x'"},
      {"optimizer", "--optimizer must be sgd or adamw, got 'x'"},
      {"lr-schedule", "--lr-schedule must be poly, cosine or step, got 'x'"},
      {"device", "--device must be auto, cpu or cuda, got 'x'"},
      {"grad-comm-dtype", "--grad-comm-dtype must be fp32, bf16 or fp16, got 'x'"},
      {"classifier-state-dtype", "--classifier-state-dtype must be fp32 or bf16"},
      {"classifier-weight-dtype", "--classifier-weight-dtype must be fp32 or bf16"},
      {"fused-classifier", "--fused-classifier must be auto, on or off, got 'x'"},
      {"fused-update", "--fused-update must be auto, on or off, got 'x'"},
      {"cudnn-benchmark", "--cudnn-benchmark must be auto, on or off, got 'x'"},
      {"conv-statistics", "--conv-statistics must be auto, on or off, got 'x'"},
  };
  ASSERT_EQ(expected.size(), choice_options().size());
  for (const ChoiceOption& o : choice_options()) {
    try {
      parse({"--" + o.option, "x"});
      ADD_FAILURE() << "--" << o.option << " x was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(e.message(), expected.at(o.option));
    }
  }
  // A saved configuration with a bad value names where it came from.
  try {
    train_config_from_ini("precision = fp8\n", "checkpoint 'c'");
    ADD_FAILURE() << "precision = fp8 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(),
              "checkpoint 'c': a configuration myriad cannot read: --precision must be auto, fp32, "
              "bf16 or fp16, got 'fp8'");
  }
  // myriad-embed's --precision has no auto.
  try {
    parse_precision("auto", {Precision::kFp32, Precision::kBf16, Precision::kFp16});
    ADD_FAILURE() << "myriad-embed's --precision accepted auto";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.message(), "--precision must be fp32, bf16 or fp16, got 'auto'");
  }
}

TEST(TrainConfig, PrecisionAutoIsFp32OnTheCpu) {
  EXPECT_EQ(parse({}).precision, Precision::kAuto);
  EXPECT_EQ(resolve_precision(Precision::kAuto, torch::kCPU), Precision::kFp32);
  for (const Precision given : {Precision::kFp32, Precision::kBf16})
    EXPECT_EQ(resolve_precision(given, torch::kCPU), given);
  EXPECT_THROW(resolve_precision(Precision::kFp16, torch::kCPU), Error);
  // The GPUs of the step model compute in bfloat16 at full speed.
  EXPECT_EQ(resolve_precision(Precision::kAuto, /*fast_bfloat16=*/true), Precision::kBf16);
  EXPECT_EQ(resolve_precision(Precision::kFp16, /*fast_bfloat16=*/true), Precision::kFp16);
}

// --conv-statistics forms batch norm's statistics in the convolutions where it can (GPUs, a build
// with cuDNN's graph API, 16-bit channels-last maps, per-rank batch norm, not --deterministic), and
// `on` is an error, naming what is missing, where it cannot.
TEST(TrainConfig, ConvStatisticsOnGpusOfBuildsWithCudnnsGraphOnly) {
  EXPECT_EQ(parse({}).conv_statistics, Toggle::kOff);
  try {
    parse({"--conv-statistics", "on", "--deterministic"});
    ADD_FAILURE() << "--conv-statistics on --deterministic was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.message(),
              "--conv-statistics on and --deterministic exclude each other (cuDNN's sums are not "
              "added in a fixed order)");
  }
  const TrainConfig parsed =
      parse({"--precision", "fp16", "--channels-last", "off", "--sync-bn", "--deterministic"});
  const ConvStatisticsRequest from_config = conv_statistics_request(parsed, torch::kCUDA);
  EXPECT_EQ(from_config.toggle, Toggle::kOff);
  EXPECT_EQ(from_config.precision, Precision::kFp16);
  EXPECT_FALSE(from_config.channels_last);
  EXPECT_TRUE(from_config.sync_bn);
  EXPECT_TRUE(from_config.deterministic);
  EXPECT_TRUE(conv_statistics_request(parse({}), torch::kCUDA).channels_last);

  // What `on` says of a request on a device: "" where it is accepted.
  const auto refusal = [](ConvStatisticsRequest r, const torch::Device& device) {
    r.toggle = Toggle::kOn;
    try {
      EXPECT_TRUE(convolution_statistics(r, device));
      return std::string();
    } catch (const Error& e) {
      return e.message();
    }
  };
  const ConvStatisticsRequest fits{Toggle::kAuto, false, Precision::kBf16, true, false};
  ConvStatisticsRequest fp16 = fits, fp32 = fits, nchw = fits, synchronised = fits,
                        deterministic = fits;
  fp16.precision = Precision::kFp16;
  fp32.precision = Precision::kFp32;
  nchw.channels_last = false;
  synchronised.sync_bn = true;
  deterministic.deterministic = true;
  EXPECT_EQ(refusal(fits, torch::kCPU), "--conv-statistics on needs GPUs");
  EXPECT_EQ(refusal(fp32, torch::kCUDA),
            "--conv-statistics on needs --precision bf16 or fp16 (the sums come from 16-bit "
            "convolutions; this run computes in fp32)");
  EXPECT_EQ(refusal(nchw, torch::kCUDA),
            "--conv-statistics on needs channels-last maps (--channels-last on)");
  // The options' conflict is named first, whatever the device.
  for (const torch::Device& device : {torch::Device(torch::kCUDA), torch::Device(torch::kCPU)}) {
    EXPECT_EQ(refusal(synchronised, device),
              "--conv-statistics on and --sync-bn exclude each other (SyncBN sums the statistics "
              "over every rank in a pass of its own)");
  }
  const std::string unbuilt =
      convolution_statistics_built()
          ? ""
          : "--conv-statistics on needs a build with cuDNN's graph API (CMake found no cuDNN 9 "
            "headers and library: set CUDNN_ROOT)";
  EXPECT_EQ(refusal(fits, torch::kCUDA), unbuilt);
  EXPECT_EQ(refusal(fp16, torch::kCUDA), unbuilt);

  // auto and off never refuse; auto takes the sums only where every condition holds.
  for (const ConvStatisticsRequest& r : {fits, fp16, fp32, nchw, synchronised, deterministic}) {
    const bool fitting =
        r.precision != Precision::kFp32 && r.channels_last && !r.sync_bn && !r.deterministic;
    ConvStatisticsRequest off = r;
    off.toggle = Toggle::kOff;
    EXPECT_EQ(convolution_statistics(r, torch::kCUDA), fitting && convolution_statistics_built());
    EXPECT_FALSE(convolution_statistics(r, torch::kCPU));
    EXPECT_FALSE(convolution_statistics(off, torch::kCUDA));
  }
}

// --cudnn-benchmark sets cuDNN's benchmark mode where it can run (GPUs, not --deterministic), and
// is an error where it was asked for and cannot.
TEST(TrainConfig, CudnnBenchmarkTimesEnginesOnGpusOnly) {
  const bool before = at::globalContext().benchmarkCuDNN();
  EXPECT_EQ(parse({}).cudnn_benchmark, Toggle::kAuto);
  try {
    parse({"--cudnn-benchmark", "on", "--deterministic"});
    ADD_FAILURE() << "--cudnn-benchmark on --deterministic was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.message(),
              "--cudnn-benchmark on and --deterministic exclude each other (the timed engines "
              "need not repeat bit for bit)");
  }
  EXPECT_THROW(convolution_engines(false, Toggle::kOn, torch::kCPU), Error);
  for (const Toggle toggle : {Toggle::kAuto, Toggle::kOn, Toggle::kOff}) {
    EXPECT_EQ(convolution_engines(true, toggle, torch::kCUDA), ConvolutionEngines::kDeterministic);
  }
  EXPECT_EQ(convolution_engines(false, Toggle::kAuto, torch::kCUDA), ConvolutionEngines::kTimed);
  EXPECT_EQ(convolution_engines(false, Toggle::kOn, torch::kCUDA), ConvolutionEngines::kTimed);
  EXPECT_EQ(convolution_engines(false, Toggle::kOff, torch::kCUDA), ConvolutionEngines::kHeuristic);
  for (const Toggle toggle : {Toggle::kAuto, Toggle::kOff}) {
    const ConvolutionEngines engines = convolution_engines(false, toggle, torch::kCPU);
    EXPECT_EQ(engines, ConvolutionEngines::kHeuristic);
    EXPECT_STREQ(use_convolution_engines(engines, torch::kCPU), "oneDNN's convolutions");
    EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  }
  if (torch::cuda::is_available()) {
    EXPECT_STREQ(use_convolution_engines(ConvolutionEngines::kTimed, torch::kCUDA),
                 "cuDNN's engines timed per shape");
    EXPECT_TRUE(at::globalContext().benchmarkCuDNN());
    EXPECT_STREQ(use_convolution_engines(ConvolutionEngines::kHeuristic, torch::kCUDA),
                 "cuDNN's heuristic engines");
    EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  }
  at::globalContext().setBenchmarkCuDNN(before);
}

TEST(TrainConfig, PrecisionsComputeInTheirDtype) {
  EXPECT_EQ(compute_dtype(Precision::kFp32), torch::kFloat32);
  EXPECT_EQ(compute_dtype(Precision::kBf16), torch::kBFloat16);
  EXPECT_EQ(compute_dtype(Precision::kFp16), torch::kFloat16);
  EXPECT_THROW(compute_dtype(Precision::kAuto), Error);
  EXPECT_FALSE(autocast_dtype(Precision::kFp32).has_value());
  EXPECT_EQ(autocast_dtype(Precision::kBf16), torch::kBFloat16);
  EXPECT_EQ(autocast_dtype(Precision::kFp16), torch::kFloat16);
}

TEST(TrainConfig, DerivedValues) {
  EXPECT_TRUE(use_channels_last(Toggle::kOn, torch::kCPU));
  EXPECT_FALSE(use_channels_last(Toggle::kAuto, torch::kCPU));
  EXPECT_FALSE(use_channels_last(Toggle::kOff, torch::kCPU));
  EXPECT_DOUBLE_EQ(parameter_state_factor(parse({})), 3.0);
  EXPECT_DOUBLE_EQ(parameter_state_factor(parse({"--optimizer", "adamw"})), 4.0);
  EXPECT_EQ(synthetic_classes(parse({})), 1000);
  EXPECT_EQ(synthetic_classes(parse({"--num-classes", "7"})), 7);
  const TrainConfig c = parse({"--backbone", "smallcnn", "--input-shape", "1x28x28",
                               "--channels-last", "on", "--activation-checkpointing"});
  const std::shared_ptr<Backbone> backbone = training_backbone(c, torch::kCPU);
  EXPECT_TRUE(backbone->channels_last());
  EXPECT_TRUE(backbone->activation_checkpointing());
  EXPECT_FALSE(
      training_backbone(parse({"--backbone", "smallcnn", "--input-shape", "1x28x28"}), torch::kCPU)
          ->channels_last());
}

TEST(TrainConfig, EffectiveConfigurationReadsBack) {
  std::string ini;
  const TrainConfig first =
      parse({"--lr", "0.05", "--lr-schedule", "step", "--lr-steps", "10,20", "--nesterov",
             "--eval-pairs", "x.h5", "y.h5", "--margin", "combined", "--m1", "1.1"},
            &ini);
  const std::string path = ::testing::TempDir() + "/myriad_train_config.ini";
  std::ofstream(path) << ini;
  const TrainConfig second = parse({"--config", path});
  EXPECT_DOUBLE_EQ(second.lr, 0.05);
  EXPECT_EQ(second.lr_steps, (std::vector<int64_t>{10, 20}));
  EXPECT_TRUE(second.nesterov);
  EXPECT_EQ(second.eval_pairs, first.eval_pairs);
  EXPECT_EQ(second.margin.type, MarginType::kCombined);
  EXPECT_DOUBLE_EQ(second.margin.m1, 1.1);
  std::remove(path.c_str());
}

// Every file in configs/ is a valid myriad-train configuration.
TEST(TrainConfig, ShippedConfigurationsParse) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MYRIAD_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".ini") continue;
    SCOPED_TRACE(entry.path().string());
    const TrainConfig c = parse({"--config", entry.path().string()});
    EXPECT_FALSE(c.backbone.empty());
    EXPECT_GT(c.batch_size, 0);
    ++count;
  }
  EXPECT_GE(count, 3);
  const TrainConfig r50 = parse({"--config", MYRIAD_SOURCE_DIR "/configs/ms1mv3_r50.ini"});
  EXPECT_EQ(r50.backbone, "r50");
  EXPECT_DOUBLE_EQ(r50.warmup_epochs, 2.0);
  EXPECT_EQ(r50.eval_pairs.size(), 3u);
  EXPECT_EQ(r50.margin.type, MarginType::kArcFace);
  EXPECT_DOUBLE_EQ(r50.margin.m2, 0.5);
  // arcface_torch's ViT recipe: AdamW, CosFace, Partial FC 0.3, warmup then linear decay.
  const TrainConfig vit = parse({"--config", MYRIAD_SOURCE_DIR "/configs/webface42m_vit_t.ini"});
  EXPECT_EQ(vit.backbone, "vit_t");
  EXPECT_EQ(vit.optimizer, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(vit.lr, 1e-3);
  EXPECT_DOUBLE_EQ(vit.weight_decay, 0.1);
  EXPECT_EQ(vit.margin.type, MarginType::kCosFace);
  EXPECT_DOUBLE_EQ(vit.margin.m3, 0.4);
  EXPECT_DOUBLE_EQ(vit.sample_rate, 0.3);
  EXPECT_DOUBLE_EQ(vit.warmup_epochs * 10, static_cast<double>(vit.epochs));
  EXPECT_EQ(vit.lr_schedule, LrScheduleKind::kPoly);
  EXPECT_DOUBLE_EQ(vit.poly_power, 1.0);
}

TEST(LrSchedule, WarmupThenPolyCosineOrStep) {
  LrSchedule s;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.kind = LrScheduleKind::kPoly;
  EXPECT_DOUBLE_EQ(s.factor(0), 0.2);
  EXPECT_DOUBLE_EQ(s.factor(3), 0.8);
  EXPECT_DOUBLE_EQ(s.factor(4), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(9), 0.25);  // (1 - 5/10)^2
  EXPECT_DOUBLE_EQ(s.factor(14), 0.0);
  s.kind = LrScheduleKind::kCosine;
  EXPECT_NEAR(s.factor(9), 0.5, 1e-12);
  EXPECT_NEAR(s.factor(14), 0.0, 1e-12);
  s.kind = LrScheduleKind::kStep;
  s.milestones = {6, 10};
  s.gamma = 0.1;
  EXPECT_DOUBLE_EQ(s.factor(5), 1.0);
  EXPECT_NEAR(s.factor(6), 0.1, 1e-12);
  EXPECT_NEAR(s.factor(12), 0.01, 1e-12);
}

}  // namespace
}  // namespace myriad

// Sharded checkpoints at whatever rank count this binary runs with: a save restores exactly on
// the same ranks; resharded copies (W+1 shards, 1 shard) load on W ranks with each rank's rows
// equal to the original classifier's; a model that does not match is an error on every rank; a
// save that fails on one rank fails on all and leaves the previous checkpoint in use.

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mpi_test.h"
#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/offline_tools.h"
#include "myriad/ckpt/torch_file.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/model/backbone.h"
#include "myriad/optim/optimizer_state.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/train/async_checkpoint.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/train/training_checkpoint.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/remove_tree.h"

namespace myriad::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kClasses = 23;
constexpr int64_t kDim = 16;

// A backbone, its SGD optimizer and a classifier shard, all with non-trivial optimizer state.
struct Model {
  std::shared_ptr<Backbone> backbone;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::unique_ptr<ShardedMarginSoftmax> classifier;
  int64_t dim = 0;

  TrainingState state() {
    TrainingState s;
    s.backbone = backbone.get();
    s.optimizer = optimizer.get();
    s.classifier = classifier.get();
    // What myriad-ckpt export-backbone builds the backbone from.
    s.config = str_format("backbone = smallcnn\ninput-shape = 1x8x8\nembedding-size = {}\n", dim);
    return s;
  }
};

class CheckpointTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    // One directory for all ranks: rank 0's name.
    root_ = context().all_gather_strings(::testing::TempDir() + "/myriad_ckpt_" +
                                         std::to_string(getpid()))[0];
    if (rank() == 0) {
      EXPECT_EQ(remove_tree(root_), "");
    }
    context().all_true(true);
  }
  void TearDown() override {
    context().all_true(true);
    if (rank() == 0) {
      EXPECT_EQ(remove_tree(root_), "");
    }
    BackendTest::TearDown();
  }

  Model make_model(uint64_t seed, int64_t classes = kClasses, int64_t dim = kDim,
                   OptimizerKind classifier_optimizer = OptimizerKind::kSgd) {
    torch::manual_seed(seed);
    Model m;
    m.dim = dim;
    BackboneOptions b;
    b.name = "smallcnn";
    b.input = {1, 8, 8};
    b.embedding_size = dim;
    m.backbone = make_backbone(b);
    m.backbone->to(device());
    m.optimizer = std::make_unique<torch::optim::SGD>(m.backbone->parameters(),
                                                      torch::optim::SGDOptions(0.1).momentum(0.9));
    ShardedSoftmaxOptions o;
    o.num_classes = classes;
    o.embedding_size = dim;
    o.seed = seed;
    o.optimizer.kind = classifier_optimizer;
    m.classifier = std::make_unique<ShardedMarginSoftmax>(comm(), o, device());
    return m;
  }

  // One training step, then rank 0's backbone and momentum everywhere, as data-parallel
  // training keeps them.
  void train_step(Model& m) {
    torch::manual_seed(1000 + rank());
    const torch::Tensor images = torch::randn({3, 1, 8, 8}).to(device());
    const torch::Tensor labels = torch::randint(0, kClasses, {3}, torch::kInt64).to(device());
    m.optimizer->zero_grad();
    m.classifier->forward(m.backbone->forward(images), labels).backward();
    m.optimizer->step();
    std::vector<torch::Tensor> state = m.backbone->parameters();
    for (const torch::Tensor& b : m.backbone->buffers()) state.push_back(b);
    broadcast_tensors(state, comm());
    for (torch::Tensor p : m.backbone->parameters()) comm().broadcast(momentum(m, p), 0);
  }

  torch::Tensor& momentum(Model& m, const torch::Tensor& p) {
    torch::optim::OptimizerParamState* state = find_param_state(*m.optimizer, p);
    if (state == nullptr) throw std::runtime_error("no momentum for a parameter");
    return static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer();
  }

  // The whole classifier (weight or momentum) in class order, gathered from the shards.
  torch::Tensor gathered(const torch::Tensor& shard, Model& m) {
    return comm().all_gather(shard.contiguous(), m.classifier->partition().sizes()).cpu();
  }

  torch::Tensor classifier_momentum(Model& m) {
    for (auto& [name, tensor] : m.classifier->optimizer().state()) {
      if (name == "momentum") return *tensor;
    }
    throw std::runtime_error("no classifier momentum");
  }

  void expect_same_backbone(Model& a, Model& b) {
    const auto pa = a.backbone->named_parameters();
    const auto pb = b.backbone->named_parameters();
    for (const auto& item : pa) {
      const torch::Tensor& other = pb[item.key()];
      EXPECT_TRUE(torch::equal(item.value().cpu(), other.cpu())) << item.key();
      EXPECT_TRUE(torch::equal(momentum(a, item.value()).cpu(), momentum(b, other).cpu()))
          << item.key();
      // Restored state takes its parameter's layout, as the fused optimizer kernels require.
      EXPECT_EQ(momentum(b, other).strides(), other.strides()) << item.key();
    }
    const auto ba = a.backbone->named_buffers();
    const auto bb = b.backbone->named_buffers();
    for (const auto& item : ba)
      EXPECT_TRUE(torch::equal(item.value().cpu(), bb[item.key()].cpu())) << item.key();
  }

  std::string root_;
};

TEST_P(CheckpointTest, SameRanksRestoreEverythingExactly) {
  Model saved = make_model(3);
  train_step(saved);
  TrainingState s = saved.state();
  s.step = 17;
  s.position = {1, 48};
  const CheckpointStore store(root_);
  save_checkpoint(context(), store, s, 2);
  EXPECT_EQ(store.latest(), store.directory_for(17));
  const torch::Tensor after_save = torch::rand({5}, torch::device(device())).cpu();

  // Saved in the default layout, loaded into a channels-last backbone (as on GPUs).
  Model loaded = make_model(4);
  loaded.backbone->set_channels_last(true);
  TrainingState l = loaded.state();
  load_checkpoint(context(), store.directory_for(17), l);
  EXPECT_EQ(l.step, 17);
  EXPECT_EQ(l.position.epoch, 1);
  EXPECT_EQ(l.position.offset, 48);
  expect_same_backbone(saved, loaded);
  EXPECT_TRUE(torch::equal(saved.classifier->weight().cpu(), loaded.classifier->weight().cpu()));
  EXPECT_TRUE(torch::equal(classifier_momentum(saved).cpu(), classifier_momentum(loaded).cpu()));
  EXPECT_EQ(loaded.classifier->steps(), saved.classifier->steps());
  EXPECT_EQ(loaded.classifier->optimizer().step(), saved.classifier->optimizer().step());
  // Each rank's random stream continues where it was saved.
  EXPECT_TRUE(torch::equal(torch::rand({5}, torch::device(device())).cpu(), after_save));
}

TEST_P(CheckpointTest, OtherWorldSizesTakeTheirRowsFromWhicheverShardsHoldThem) {
  Model saved = make_model(5);
  train_step(saved);
  TrainingState s = saved.state();
  s.step = 3;
  const CheckpointStore store(root_ + "/run");
  save_checkpoint(context(), store, s, 1);
  // The reference: the original classifier gathered in memory, never read from a file.
  const torch::Tensor weight = gathered(saved.classifier->weight(), saved);
  const torch::Tensor momentum = gathered(classifier_momentum(saved), saved);

  const std::string more = root_ + "/more";
  const std::string one = root_ + "/one";
  const std::string merged = root_ + "/merged.h5";
  if (rank() == 0) {
    reshard_checkpoint(store.directory_for(3), more, world() + 1);
    reshard_checkpoint(store.directory_for(3), one, 1);
    merge_classifier(store.directory_for(3), merged);
    // The export, read back by LibTorch's own torch.load-format reader and by myriad's: every
    // parameter and buffer, by state-dict name, in state-dict order.
    const std::string exported = root_ + "/backbone.pt";
    export_backbone(store.directory_for(3), exported);
    std::ifstream in(exported, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    const c10::Dict<c10::IValue, c10::IValue> state = torch::pickle_load(bytes).toGenericDict();
    const StateDict expected = saved.backbone->state_dict();
    const StateDict read_back = read_torch_state_dict(exported);
    ASSERT_EQ(state.size(), expected.size());
    ASSERT_EQ(read_back.size(), expected.size());
    auto entry = state.begin();
    for (size_t i = 0; i < expected.size(); ++i, ++entry) {
      const auto& [name, tensor] = expected[i];
      EXPECT_EQ(entry->key().toStringRef(), name);
      EXPECT_TRUE(torch::equal(entry->value().toTensor(), tensor.cpu())) << name;
      EXPECT_EQ(read_back[i].first, name);
      EXPECT_TRUE(torch::equal(read_back[i].second, tensor.cpu())) << name;
    }
  }
  context().all_true(true);
  EXPECT_TRUE(torch::equal(Hdf5File(merged, Hdf5File::Mode::kRead).read("weight"), weight));

  for (const std::string& directory : {more, one}) {
    EXPECT_EQ(read_manifest(directory).world_size, directory == more ? world() + 1 : 1);
    Model loaded = make_model(6);
    TrainingState l = loaded.state();
    load_checkpoint(context(), directory, l);
    EXPECT_EQ(l.step, 3);
    expect_same_backbone(saved, loaded);
    EXPECT_TRUE(torch::equal(gathered(loaded.classifier->weight(), loaded), weight)) << directory;
    EXPECT_TRUE(torch::equal(gathered(classifier_momentum(loaded), loaded), momentum)) << directory;
  }
}

TEST_P(CheckpointTest, AnotherModelIsAnErrorOnEveryRank) {
  Model saved = make_model(7);
  TrainingState s = saved.state();
  const CheckpointStore store(root_);
  save_checkpoint(context(), store, s, 1);
  const auto error_of = [&](Model m) {
    TrainingState l = m.state();
    try {
      load_checkpoint(context(), store.directory_for(0), l);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  EXPECT_NE(error_of(make_model(8, kClasses + 1))
                .find("holds a classifier of 23 classes x 16, this run has 24 x 16"),
            std::string::npos);
  EXPECT_NE(
      error_of(make_model(8, kClasses, kDim * 2)).find("holds a classifier of 23 classes x 16"),
      std::string::npos);
  EXPECT_NE(error_of(make_model(8, kClasses, kDim, OptimizerKind::kAdamW))
                .find("has no state/exp_avg: saved with another optimizer?"),
            std::string::npos);
}

TEST_P(CheckpointTest, AFailedSaveFailsEveryRankAndKeepsThePreviousCheckpoint) {
  Model saved = make_model(9);
  TrainingState s = saved.state();
  s.step = 1;
  const CheckpointStore store(root_);
  save_checkpoint(context(), store, s, 3);
  s.step = 2;
  setenv("MYRIAD_FAULT_SAVE_RANK", std::to_string(world() - 1).c_str(), 1);
  std::string message;
  try {
    save_checkpoint(context(), store, s, 3);
  } catch (const Error& e) {
    message = e.message();
  }
  unsetenv("MYRIAD_FAULT_SAVE_RANK");
  EXPECT_NE(message.find("checkpoint at step 2 failed on rank " + std::to_string(world() - 1)),
            std::string::npos)
      << message;
  EXPECT_EQ(store.latest(), store.directory_for(1));
  EXPECT_EQ(resume_candidates("auto", store).front(), store.directory_for(1));
  EXPECT_FALSE(fs::exists(store.directory_for(2)));
}

// --resume: auto skips a checkpoint that fails verification on any rank (the newest, damaged in
// the last rank's shard) and loads the previous one; a checkpoint named explicitly must verify,
// and its failure leaves the state untouched; "none" loads nothing.
TEST_P(CheckpointTest, ResumeAutoFallsBackPastACheckpointThatFailsVerification) {
  Model saved = make_model(11);
  TrainingState s = saved.state();
  const CheckpointStore store(root_);
  s.step = 5;
  save_checkpoint(context(), store, s, 3);
  train_step(saved);
  s.step = 10;
  save_checkpoint(context(), store, s, 3);
  if (rank() == 0) {
    fs::resize_file(store.directory_for(10) + "/" + shard_file_name(world() - 1), 100);
  }
  context().all_true(true);

  Model none = make_model(12);
  TrainingState n = none.state();
  EXPECT_FALSE(resume_training(context(), "none", store, n).has_value());
  EXPECT_EQ(n.step, 0);

  Model loaded = make_model(12);
  TrainingState l = loaded.state();
  EXPECT_EQ(resume_training(context(), "auto", store, l), store.directory_for(5));
  EXPECT_EQ(l.step, 5);

  Model named = make_model(12);
  TrainingState e = named.state();
  const torch::Tensor before = named.classifier->weight().clone();
  try {
    resume_training(context(), store.directory_for(10), store, e);
    ADD_FAILURE() << "a truncated shard was loaded";
  } catch (const CheckpointInvalid& error) {
    EXPECT_NE(error.message().find(str_format("failed on rank {}", world() - 1)), std::string::npos)
        << error.message();
    EXPECT_NE(error.message().find("bytes, its manifest says"), std::string::npos);
  }
  EXPECT_TRUE(torch::equal(named.classifier->weight(), before));
  EXPECT_EQ(e.step, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointTest, ::testing::Values("mpi", "nccl"), backend_name);

}  // namespace
}  // namespace myriad::testing

// myriad's backbones against arcface_torch's, for every net it has: the state dict's names,
// shapes, dtypes and order against its key files, and the embedding of its formula weights
// against the golden embeddings its own model computed (tests/data/interop/README.md). The first
// is the test of the names, the second of the architecture.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "myriad/model/backbone.h"
#include "myriad/util/hdf5_file.h"
#include "support/interop.h"

namespace myriad {
namespace {

using testing::KeyEntry;

const char* const kNets[] = {"r18",   "r34",   "r50",   "r100",  "r200", "mbf",
                             "vit_t", "vit_s", "vit_b", "vit_l", "vit_h"};

std::shared_ptr<Backbone> build(const std::string& net) {
  BackboneOptions o;
  o.name = net;
  o.input = {3, 112, 112};
  o.embedding_size = 512;
  return make_backbone(o);
}

class Interop : public ::testing::TestWithParam<const char*> {};

TEST_P(Interop, StateDictMatchesTheKeyFile) {
  const std::string net = GetParam();
  const std::vector<KeyEntry> keys = testing::read_keys(net);
  auto model = build(net);
  const auto state = model->state_dict();
  ASSERT_EQ(state.size(), keys.size()) << net;
  for (size_t j = 0; j < keys.size(); ++j) {
    const auto& [name, tensor] = state[j];
    EXPECT_EQ(name, keys[j].name) << net << " entry " << j;
    EXPECT_EQ(tensor.sizes().vec(), keys[j].shape) << net << " " << name;
    EXPECT_EQ(tensor.scalar_type() == torch::kInt64 ? "int64" : "float32", keys[j].dtype)
        << net << " " << name;
    EXPECT_EQ(tensor.scalar_type() == torch::kInt64 || tensor.scalar_type() == torch::kFloat32,
              true);
  }
  // Every entry belongs to exactly one block, in state-dict order.
  int64_t block = 0;
  for (const auto& [name, tensor] : state) {
    const int64_t b = model->block_of(name);
    EXPECT_GE(b, 0);
    block = b;
  }
  EXPECT_EQ(block + 1, model->num_blocks()) << net;
}

TEST_P(Interop, FormulaWeightsGiveTheGoldenEmbedding) {
  const std::string net = GetParam();
  torch::manual_seed(0);
  auto model = build(net);
  testing::set_formula_weights(*model);
  model->eval();
  const Hdf5File golden(testing::interop_file("golden.h5"), Hdf5File::Mode::kRead);
  const torch::Tensor input = golden.read("input").to(torch::kFloat32);
  const torch::Tensor expected = golden.read(net);
  torch::NoGradGuard no_grad;
  const torch::Tensor got = model->forward(input).to(torch::kFloat64);
  ASSERT_EQ(got.sizes(), expected.sizes());
  const torch::Tensor error = (got - expected).norm(2, 1) / expected.norm(2, 1);
  for (int64_t row = 0; row < error.size(0); ++row) {
    EXPECT_LE(error[row].item<double>(), 1e-4) << net << " row " << row;
  }
  std::printf("%s: relative error %.3g, %.3g\n", net.c_str(), error[0].item<double>(),
              error[1].item<double>());
}

INSTANTIATE_TEST_SUITE_P(Nets, Interop, ::testing::ValuesIn(kNets));

}  // namespace
}  // namespace myriad

// Every collective, for every dtype, on both backends, at whatever rank count the binary runs
// with. Expected values are computed from the rank and the world size alone.

#include <functional>
#include <numeric>
#include <tuple>
#include <vector>

#include "mpi_test.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad::testing {
namespace {

// Small positive integers: exact in every dtype, even summed over many ranks.
torch::Tensor pattern(std::vector<int64_t> shape, int64_t scale, torch::ScalarType dtype,
                      const torch::Device& device, int64_t first_row = 0) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  int64_t row = numel / std::max<int64_t>(1, shape.empty() ? 1 : shape[0]);
  if (shape.empty()) row = 1;
  torch::Tensor v =
      (torch::arange(first_row * row, first_row * row + numel, torch::kInt64) % 5 + 1) * scale;
  return v.reshape(shape).to(device, dtype);
}

std::vector<int64_t> uneven_counts(int world) {
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = (3 * r + 2) % 5;  // 2, 0, 3, 1, 4, ...: includes 0
  return counts;
}

// Runs `call`, expecting the same collective Error on every rank; returns its message.
template <class F>
std::string expect_collective_error(F call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective()) << e.what();
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a myriad::Error, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected an error, the call succeeded";
  return {};
}

void expect_equal(const torch::Tensor& actual, const torch::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(torch::equal(actual.cpu(), expected.cpu()))
      << "got " << actual.cpu().flatten().slice(0, 0, 12) << "\nexpected "
      << expected.cpu().flatten().slice(0, 0, 12);
}

using DtypeCase = std::tuple<std::string, torch::ScalarType>;

class CollectiveTest : public MpiTest, public ::testing::WithParamInterface<DtypeCase> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == "nccl") {
      if (!environment().gpus) GTEST_SKIP() << "NCCL tests need a CUDA device on every rank";
      device_ = environment().gpu;
    }
  }
  torch::ScalarType dtype() const { return std::get<1>(GetParam()); }
  torch::Device device() const { return device_; }
  Communicator& comm() { return MpiTest::comm(device_); }

 private:
  torch::Device device_{torch::kCPU};
};

TEST_P(CollectiveTest, AllReduceSumMaxMin) {
  const int64_t w = world();
  const std::vector<int64_t> shape{7, 3};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    torch::Tensor t = pattern(shape, rank() + 1, dtype(), device());
    comm().all_reduce(t, op);
    const int64_t scale = op == ReduceOp::kSum ? w * (w + 1) / 2 : op == ReduceOp::kMax ? w : 1;
    expect_equal(t, pattern(shape, scale, dtype(), torch::kCPU));
  }
}

TEST_P(CollectiveTest, AllGatherEqual) {
  const torch::Tensor mine = pattern({4, 2}, rank() + 1, dtype(), device(), 4 * rank());
  const torch::Tensor all = comm().all_gather(mine);
  std::vector<torch::Tensor> blocks;
  for (int r = 0; r < world(); ++r)
    blocks.push_back(pattern({4, 2}, r + 1, dtype(), torch::kCPU, 4 * r));
  expect_equal(all, torch::cat(blocks));
}

TEST_P(CollectiveTest, AllGatherVariableRows) {
  const std::vector<int64_t> counts = uneven_counts(world());
  const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
  const torch::Tensor mine = pattern({counts[rank()], 3, 2}, rank() + 1, dtype(), device(), before);
  const torch::Tensor all = comm().all_gather(mine, counts);
  std::vector<torch::Tensor> blocks;
  int64_t offset = 0;
  for (int r = 0; r < world(); ++r) {
    blocks.push_back(pattern({counts[r], 3, 2}, r + 1, dtype(), torch::kCPU, offset));
    offset += counts[r];
  }
  expect_equal(all, torch::cat(blocks));
}

TEST_P(CollectiveTest, ReduceScatterEqual) {
  const int64_t w = world();
  const torch::Tensor input = pattern({3 * w, 2}, rank() + 1, dtype(), device());
  const torch::Tensor mine = comm().reduce_scatter(input);
  expect_equal(mine, pattern({3, 2}, w * (w + 1) / 2, dtype(), torch::kCPU, 3 * rank()));
}

TEST_P(CollectiveTest, ReduceScatterVariableRowsWithMax) {
  const int64_t w = world();
  const std::vector<int64_t> counts = uneven_counts(world());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
  const torch::Tensor input = pattern({total, 4}, rank() + 1, dtype(), device());
  expect_equal(comm().reduce_scatter(input, counts),
               pattern({counts[rank()], 4}, w * (w + 1) / 2, dtype(), torch::kCPU, before));
  expect_equal(comm().reduce_scatter(input, counts, ReduceOp::kMax),
               pattern({counts[rank()], 4}, w, dtype(), torch::kCPU, before));
}

TEST_P(CollectiveTest, BroadcastFromLastRank) {
  const int root = world() - 1;
  torch::Tensor t = rank() == root ? pattern({5, 3}, 2, dtype(), device())
                                   : torch::zeros({5, 3}, torch::device(device()).dtype(dtype()));
  comm().broadcast(t, root);
  expect_equal(t, pattern({5, 3}, 2, dtype(), torch::kCPU));
}

TEST_P(CollectiveTest, GatherAndScatterAtMiddleRoot) {
  const int root = world() / 2;
  const std::vector<int64_t> counts = uneven_counts(world());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});

  const torch::Tensor mine = pattern({counts[rank()], 2}, 1, dtype(), device(), before);
  const torch::Tensor gathered = comm().gather(mine, counts, root);
  if (rank() == root) {
    expect_equal(gathered, pattern({total, 2}, 1, dtype(), torch::kCPU));
  } else {
    EXPECT_EQ(gathered.size(0), 0);
  }

  const torch::Tensor source = rank() == root
                                   ? pattern({total, 2}, 3, dtype(), device())
                                   : torch::empty({0, 2}, torch::device(device()).dtype(dtype()));
  expect_equal(comm().scatter(source, counts, root),
               pattern({counts[rank()], 2}, 3, dtype(), torch::kCPU, before));
}

TEST_P(CollectiveTest, EmptyTensors) {
  torch::Tensor empty = torch::empty({0, 4}, torch::device(device()).dtype(dtype()));
  comm().all_reduce(empty);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(comm().all_gather(empty).sizes(), (std::vector<int64_t>{0, 4}));
  const std::vector<int64_t> zeros(world(), 0);
  EXPECT_EQ(comm().all_gather(empty, zeros).sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(comm().reduce_scatter(empty, zeros).sizes(), (std::vector<int64_t>{0, 4}));
  comm().broadcast(empty, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveTest,
                         ::testing::Combine(::testing::Values("mpi", "nccl"),
                                            ::testing::Values(torch::kFloat64, torch::kFloat32,
                                                              torch::kBFloat16, torch::kFloat16,
                                                              torch::kInt64, torch::kInt32)),
                         [](const ::testing::TestParamInfo<DtypeCase>& info) {
                           return std::get<0>(info.param) + "_" +
                                  c10::toString(std::get<1>(info.param));
                         });

class CommunicatorTest : public BackendTest {};

// Half-precision sums on MPI go through a custom operation; compare with float32 arithmetic on
// the same random inputs, which every rank can regenerate from the ranks' seeds.
TEST_P(CommunicatorTest, HalfPrecisionSumMatchesFloat32) {
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat16}) {
    auto values_of = [&](int r) {
      torch::manual_seed(1000 + r);
      return torch::randn({4096}).to(dtype);
    };
    torch::Tensor mine = values_of(rank()).to(device());
    comm().all_reduce(mine);
    torch::Tensor reference = torch::zeros({4096});
    torch::Tensor magnitude = torch::zeros({4096});
    for (int r = 0; r < world(); ++r) {
      reference += values_of(r).to(torch::kFloat32);
      magnitude += values_of(r).to(torch::kFloat32).abs();
    }
    const double eps = dtype == torch::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
    const torch::Tensor error = (mine.cpu().to(torch::kFloat32) - reference).abs();
    // Each of the W-1 pairwise roundings costs at most eps/2 of a partial sum, which is bounded
    // by the sum of magnitudes.
    const torch::Tensor bound = magnitude * (eps * world() / 2) + 1e-6;
    EXPECT_TRUE(error.le(bound).all().item<bool>())
        << c10::toString(dtype) << " max error " << error.max().item<double>();
  }
}

TEST_P(CommunicatorTest, SixtyFourMegabyteTensors) {
  const int64_t w = world();
  const int64_t elements = (int64_t{64} << 20) / 4;
  torch::Tensor big =
      torch::full({elements}, static_cast<float>(rank() + 1), torch::device(device()));
  comm().all_reduce(big);
  EXPECT_TRUE(big.eq(static_cast<float>(w * (w + 1) / 2)).all().item<bool>());

  const int64_t rows = elements / w;
  const torch::Tensor mine =
      torch::full({rows}, static_cast<float>(rank()), torch::device(device()));
  const torch::Tensor all = comm().all_gather(mine);
  ASSERT_EQ(all.numel(), rows * w);
  const torch::Tensor expected = torch::arange(w, torch::kFloat32).repeat_interleave(rows);
  EXPECT_TRUE(torch::equal(all.cpu(), expected));

  const torch::Tensor scattered = comm().reduce_scatter(big.narrow(0, 0, rows * w));
  EXPECT_TRUE(scattered.eq(static_cast<float>(w * w * (w + 1) / 2)).all().item<bool>());
}

TEST_P(CommunicatorTest, AllGatherCountsOverControlPlane) {
  const std::vector<int64_t> counts = comm().all_gather_counts(10 * rank() + 1);
  ASSERT_EQ(static_cast<int>(counts.size()), world());
  for (int r = 0; r < world(); ++r) EXPECT_EQ(counts[r], 10 * r + 1);
}

TEST_P(CommunicatorTest, MismatchedShapesFailOnEveryRank) {
  if (world() == 1) GTEST_SKIP() << "needs two ranks";
  torch::Tensor t = torch::ones({rank() == 0 ? 4 : 5}, torch::device(device()));
  const std::string message = expect_collective_error([&] { comm().all_reduce(t); });
  EXPECT_NE(message.find("shapes differ"), std::string::npos) << message;
}

TEST_P(CommunicatorTest, MismatchedDtypesFailOnEveryRank) {
  if (world() == 1) GTEST_SKIP() << "needs two ranks";
  torch::Tensor t = torch::ones(
      {4}, torch::device(device()).dtype(rank() == 0 ? torch::kFloat32 : torch::kFloat64));
  const std::string message = expect_collective_error([&] { comm().all_gather(t); });
  EXPECT_NE(message.find("dtypes differ"), std::string::npos) << message;
}

TEST_P(CommunicatorTest, OneRanksWrongCountFailsOnEveryRank) {
  std::vector<int64_t> counts(world(), 2);
  torch::Tensor t = torch::ones({rank() == world() - 1 ? 3 : 2, 2}, torch::device(device()));
  const std::string message = expect_collective_error([&] { comm().all_gather(t, counts); });
  EXPECT_NE(message.find(str_format("rank {}", world() - 1)), std::string::npos) << message;
  EXPECT_NE(message.find("counts entry says 2 rows"), std::string::npos) << message;
}

TEST_P(CommunicatorTest, UnsupportedDtypeAndBadRootAreRejected) {
  torch::Tensor flags = torch::ones({3}, torch::device(device()).dtype(torch::kBool));
  EXPECT_NE(expect_collective_error([&] { comm().all_reduce(flags); }).find("dtype"),
            std::string::npos);
  torch::Tensor t = torch::ones({3}, torch::device(device()));
  EXPECT_NE(expect_collective_error([&] { comm().broadcast(t, world()); }).find("root"),
            std::string::npos);
  torch::Tensor odd = torch::ones({world() * 2 + 1}, torch::device(device()));
  if (world() > 1) {
    EXPECT_NE(expect_collective_error([&] { comm().reduce_scatter(odd); }).find("split evenly"),
              std::string::npos);
  }
}

TEST_P(CommunicatorTest, NonContiguousInPlaceIsRejectedAndOutOfPlaceAccepted) {
  torch::Tensor base = torch::ones({4, 6}, torch::device(device()));
  torch::Tensor strided = base.t();
  EXPECT_NE(expect_collective_error([&] { comm().all_reduce(strided); }).find("not contiguous"),
            std::string::npos);
  const torch::Tensor gathered = comm().all_gather(strided);
  EXPECT_EQ(gathered.size(0), 6 * world());
}

TEST_P(CommunicatorTest, TensorOnTheWrongDeviceIsRejected) {
  const torch::Device wrong =
      device().is_cpu() ? torch::Device(torch::kMeta) : torch::Device(torch::kCPU);
  torch::Tensor t = torch::empty({3}, torch::device(wrong));
  const std::string message = expect_collective_error([&] { comm().all_reduce(t); });
  EXPECT_NE(message.find("this communicator moves tensors on"), std::string::npos) << message;
}

TEST_P(CommunicatorTest, DifferentCollectivesOnDifferentRanksAreDetected) {
  if (world() == 1) GTEST_SKIP() << "needs two ranks";
  torch::Tensor t = torch::ones({3}, torch::device(device()));
  const std::string message = expect_collective_error([&] {
    if (rank() == 0) {
      comm().all_reduce(t);
    } else {
      comm().broadcast(t, 0);
    }
  });
  EXPECT_NE(message.find("different collective"), std::string::npos) << message;
}

// Sub-communicators by colour (what pipeline stages are built on): ranks of a colour reduce among
// themselves only, in the order of their keys.
TEST_P(CommunicatorTest, SplitCommunicatorsReduceWithinTheirGroup) {
  const int color = rank() % 2;
  auto group = environment().comms->create_split(device(), color, -rank());
  int members = 0, below = 0;
  for (int r = 0; r < world(); ++r) {
    if (r % 2 != color) continue;
    ++members;
    if (r > rank()) ++below;  // keys are -rank: the highest rank comes first
  }
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), below);
  torch::Tensor t = torch::full({3}, static_cast<double>(rank() + 1), torch::device(device()));
  group->all_reduce(t);
  double expected = 0;
  for (int r = color; r < world(); r += 2) expected += r + 1;
  EXPECT_DOUBLE_EQ(t[0].item<double>(), expected);
}

// A communicator of its own whose NCCL kernels take one CTA (what a pipeline's classifier gets):
// the collectives the classifier runs give the same results, on tensors of several megabytes,
// which one CTA moves in many steps. A negative count is refused before anything is created.
TEST_P(CommunicatorTest, CommunicatorWithOneCtaPerKernelGivesTheSameResults) {
  EXPECT_THROW(environment().comms->create(device(), CommOptions{-1}), Error);
  auto few = environment().comms->create(device(), CommOptions{1});
  ASSERT_EQ(few->size(), world());
  ASSERT_EQ(few->rank(), rank());
  const int64_t w = world();
  const int64_t rows = int64_t{1} << 18;  // 4 MiB of float32 per rank's block
  torch::Tensor t = pattern({rows, 4}, rank() + 1, torch::kFloat32, device());
  few->all_reduce(t);
  expect_equal(t, pattern({rows, 4}, w * (w + 1) / 2, torch::kFloat32, torch::kCPU));

  const std::vector<int64_t> counts = uneven_counts(world());
  std::vector<int64_t> sizes(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) sizes[r] = counts[r] * rows / 4;
  const int64_t before = std::accumulate(sizes.begin(), sizes.begin() + rank(), int64_t{0});
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const torch::Tensor mine =
      pattern({sizes[rank()], 4}, rank() + 1, torch::kBFloat16, device(), before);
  std::vector<torch::Tensor> blocks;
  int64_t offset = 0;
  for (int r = 0; r < world(); ++r) {
    blocks.push_back(pattern({sizes[r], 4}, r + 1, torch::kBFloat16, torch::kCPU, offset));
    offset += sizes[r];
  }
  expect_equal(few->all_gather(mine, sizes), torch::cat(blocks));

  const torch::Tensor input = pattern({total, 4}, rank() + 1, torch::kFloat32, device());
  expect_equal(few->reduce_scatter(input, sizes),
               pattern({sizes[rank()], 4}, w * (w + 1) / 2, torch::kFloat32, torch::kCPU, before));
}

// Point to point along a chain: each rank sends its neighbour activations, their keys and an
// absent tensor, and takes its other neighbour's; shapes are learnt by the receiver.
TEST_P(CommunicatorTest, PointToPointMovesTensorsBetweenNeighbours) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto options = torch::device(device());
  for (int phase = 0; phase < 2; ++phase) {
    // Even ranks send first, odd ranks receive first: no rank waits on one that waits on it.
    const bool sending = (rank() + phase) % 2 == 0;
    const int peer = sending ? rank() + 1 : rank() - 1;
    if (peer < 0 || peer >= world()) continue;
    if (sending) {
      comm().send(
          {torch::full({2, rank() + 1, 3}, rank() + 0.5, options.dtype(torch::kFloat32)),
           torch::arange(rank(), rank() + 4, options.dtype(torch::kInt64)), torch::Tensor()},
          peer);
    } else {
      const std::vector<torch::Tensor> got =
          comm().recv({torch::kFloat32, torch::kInt64, torch::kInt64}, peer);
      ASSERT_EQ(got.size(), 3u);
      EXPECT_EQ(got[0].sizes(), (std::vector<int64_t>{2, peer + 1, 3}));
      EXPECT_TRUE(torch::all(got[0].eq(peer + 0.5)).item<bool>());
      EXPECT_TRUE(torch::equal(got[1].cpu(), torch::arange(peer, peer + 4, torch::kInt64)));
      EXPECT_FALSE(got[2].defined());
    }
  }
}

// Exchange: each pair of neighbours sends the other a tensor and takes the other's, in one call
// on both sides (what two blocking sends would deadlock on, with NCCL's rendezvous), and large
// enough to need the receiver on the way.
TEST_P(CommunicatorTest, ExchangeSendsBothWaysAtOnce) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto options = torch::device(device());
  const int pair = rank() / 2, peer = rank() % 2 == 0 ? rank() + 1 : rank() - 1;
  if (peer >= world()) GTEST_SKIP() << "rank " << rank() << " has no partner";
  const int64_t n = (int64_t{1} << 20) + rank();
  const std::vector<torch::Tensor> got = comm().exchange(
      {torch::full({n}, rank() + 0.25, options.dtype(torch::kFloat32)), torch::Tensor()},
      {torch::ScalarType::Undefined, torch::kInt64}, peer);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].numel(), (int64_t{1} << 20) + peer) << "pair " << pair;
  EXPECT_TRUE(torch::all(got[0].eq(peer + 0.25)).item<bool>());
  EXPECT_FALSE(got[1].defined());
}

// A pair that disagrees fails on both ranks, whichever side is wrong, and moves no data.
TEST_P(CommunicatorTest, PointToPointDisagreementsFailOnBothRanks) {
  if (world() < 2 || rank() > 1) GTEST_SKIP() << "ranks 0 and 1";
  const auto options = torch::device(device());
  const int peer = 1 - rank();
  const auto error = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  // Another dtype than the receiver expects.
  std::string message = error([&] {
    if (rank() == 0) comm().send({torch::ones({4}, options.dtype(torch::kFloat32))}, peer);
    if (rank() == 1) comm().recv({torch::kFloat64}, peer);
  });
  EXPECT_NE(message.find("rank 0 sends (Float [4]) to rank 1, which expects (Double)"),
            std::string::npos)
      << message;
  // Both ranks sending: an error, not two ranks waiting forever.
  message = error([&] { comm().send({torch::ones({2}, options)}, peer); });
  EXPECT_NE(message.find("both send to each other"), std::string::npos) << message;
  // A tensor the sender cannot move (not contiguous).
  message = error([&] {
    if (rank() == 0) comm().send({torch::ones({4, 4}, options).t()}, peer);
    if (rank() == 1) comm().recv({torch::kFloat32}, peer);
  });
  EXPECT_NE(message.find("rank 0 cannot send (Float [4, 4]) to rank 1"), std::string::npos)
      << message;
  // An exchange against a plain send: what the exchanging rank sends has no taker.
  message = error([&] {
    if (rank() == 0) comm().exchange({torch::ones({2}, options)}, {torch::kFloat32}, peer);
    if (rank() == 1) comm().send({torch::ones({2}, options)}, peer);
  });
  EXPECT_NE(message.find("rank 0 sends (Float [2]) to rank 1, which does not receive from it"),
            std::string::npos)
      << message;
  // An exchange expecting other dtypes than the peer's exchange sends.
  message = error([&] {
    comm().exchange(
        {torch::ones({2}, options.dtype(rank() == 0 ? torch::kFloat32 : torch::kInt64))},
        {torch::kFloat32}, peer);
  });
  EXPECT_NE(message.find("rank 1 sends (Long [2]) to rank 0, which expects (Float)"),
            std::string::npos)
      << message;
}

TEST_P(CommunicatorTest, BarrierReturnsOnEveryRank) {
  comm().barrier();
  SUCCEED();
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorTest, ::testing::Values("mpi", "nccl"),
                         backend_name);

#ifdef MYRIAD_WITH_CUDA
// The NCCL backend must follow LibTorch's current stream: work queued on a side stream before
// the collective is seen by it, and work queued after sees its result, with no explicit sync.
TEST_P(CommunicatorTest, NcclFollowsTheCurrentStream) {
  if (!device().is_cuda()) GTEST_SKIP() << "CUDA only";
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device().index());
  c10::cuda::CUDAStreamGuard guard(side);
  torch::Tensor t = torch::empty({1 << 20}, torch::device(device()));
  for (int i = 0; i < 8; ++i) {
    t.fill_(static_cast<float>(rank() + i));
    comm().all_reduce(t);
    t.mul_(2.0);
    const int64_t w = world();
    const float expected = 2.0f * static_cast<float>(w * (w - 1) / 2 + w * i);
    EXPECT_TRUE(t.eq(expected).all().item<bool>()) << "iteration " << i;
  }
}
#endif

}  // namespace
}  // namespace myriad::testing

// The run's step observers, through train() itself: every phase of every step reaches an observer
// in order, after the run's own observers (the progress report's records are written by then), a
// resumed run starts its phases where the checkpoint ends, and the classifier's backward passes
// come once per step with GPipe and once per micro-batch with 1F1B and interleaved 1F1B.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "mpi_test.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"
#include "myriad/train/trainer.h"
#include "myriad/util/remove_tree.h"

namespace myriad::testing {
namespace {

// What an observer saw: the phase's name and step, in order.
struct Seen {
  std::string phase;
  int64_t step = 0;
  bool operator==(const Seen& o) const { return phase == o.phase && step == o.step; }
};

std::ostream& operator<<(std::ostream& out, const Seen& s) {
  return out << s.phase << ' ' << s.step;
}

class Recorder : public StepObserver {
 public:
  explicit Recorder(std::string metrics) : metrics_(std::move(metrics)) {}
  void run_started(const RunStart& e) override {
    seen.push_back({"run", e.first_step});
    total = e.total_steps;
  }
  void step_started(const StepStart& e) override { seen.push_back({"start", e.step}); }
  void batch_ready(const BatchReady& e) override {
    seen.push_back({"batch", e.step});
    EXPECT_GE(e.data_wait_seconds, 0.0);
  }
  void before_backward(const BeforeBackward& e) override { seen.push_back({"backward", e.step}); }
  void step_finished(const StepEnd& e) override {
    seen.push_back({"end", e.step});
    EXPECT_EQ(e.total_steps, total);
    EXPECT_TRUE(e.loss.defined() && std::isfinite(e.loss.item<double>())) << "step " << e.step;
    lrs.push_back(e.lr);
    train_records.push_back(count_train_records());
  }

  std::vector<Seen> seen;
  std::vector<double> lrs;
  std::vector<int> train_records;  // metrics.jsonl's "train" records at each step's end
  int64_t total = -1;

 private:
  int count_train_records() const {
    std::ifstream in(metrics_);
    int n = 0;
    for (std::string line; std::getline(in, line);)
      n += line.find("\"kind\":\"train\"") != std::string::npos;
    return n;
  }
  std::string metrics_;
};

// The phases that `steps` [first, last) of a run must show, with `backwards` passes each.
std::vector<Seen> expected_phases(int64_t first, int64_t last, int backwards) {
  std::vector<Seen> phases = {{"run", first}};
  for (int64_t s = first; s < last; ++s) {
    phases.push_back({"start", s});
    phases.push_back({"batch", s});
    for (int b = 0; b < backwards; ++b) phases.push_back({"backward", s});
    phases.push_back({"end", s});
  }
  return phases;
}

class TrainerTest : public MpiTest {
 protected:
  void SetUp() override {
    // One run directory for all ranks: rank 0's name.
    run_dir_ = context().all_gather_strings(::testing::TempDir() + "/myriad_trainer_" +
                                            std::to_string(getpid()))[0];
    if (rank() == 0) {
      EXPECT_EQ(remove_tree(run_dir_), "");
    }
    context().all_true(true);
  }
  void TearDown() override {
    context().all_true(true);
    if (rank() == 0) {
      EXPECT_EQ(remove_tree(run_dir_), "");
    }
    MpiTest::TearDown();
  }

  TrainConfig config(const std::string& extra) const {
    const std::string ini =
        "data = synthetic\ninput-shape = 1x16x16\nbackbone = smallcnn\nembedding-size = 16\n"
        "num-classes = 40\nbatch-size = 8\nworkers = 1\nthreads = 1\ndevice = cpu\n"
        "lr = 0.1\nwarmup-steps = 2\nlog-every = 3\nrun-dir = " +
        run_dir_ + "\n" + extra;
    return train_config_from_ini(ini, "the test's configuration");
  }
  TrainResult run(const std::string& extra, Recorder& recorder) {
    const TrainConfig c = config(extra);
    return train(context(), c, "# the test's run\n", {&recorder});
  }
  std::string metrics() const { return run_dir_ + "/metrics.jsonl"; }

  std::string run_dir_;
};

TEST_F(TrainerTest, ObserversSeeEveryPhaseInOrderAfterTheRunsOwn) {
  Recorder recorder(metrics());
  const TrainResult result = run("max-steps = 6\n", recorder);
  EXPECT_EQ(result.steps, 6);
  EXPECT_FALSE(result.stopped);
  EXPECT_EQ(recorder.seen, expected_phases(0, 6, 1));
  if (rank() == 0) {
    // The progress report writes a record every 3 steps before the observers added after it.
    EXPECT_EQ(recorder.train_records, (std::vector<int>{0, 0, 1, 1, 1, 2}));
  }
  // Two warm-up steps: the rate rises, then falls (poly).
  ASSERT_EQ(recorder.lrs.size(), 6u);
  EXPECT_LT(recorder.lrs[0], recorder.lrs[1]);
  EXPECT_GT(recorder.lrs[2], recorder.lrs[5]);
}

TEST_F(TrainerTest, ResumedRunStartsItsPhasesWhereTheCheckpointEnds) {
  Recorder first(metrics());
  const TrainResult stopped = run("max-steps = 6\nstop-at-step = 4\n", first);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.steps, 4);
  EXPECT_EQ(first.seen, expected_phases(0, 4, 1));
  Recorder second(metrics());
  const TrainResult resumed = run("max-steps = 6\nresume = auto\n", second);
  EXPECT_FALSE(resumed.stopped);
  EXPECT_EQ(resumed.steps, 6);
  EXPECT_EQ(second.seen, expected_phases(4, 6, 1));
  // The schedule continues: the rates of the resumed steps are the uninterrupted run's.
  Recorder whole(metrics());
  if (rank() == 0) {
    EXPECT_EQ(remove_tree(run_dir_), "");
  }
  context().all_true(true);
  run("max-steps = 6\n", whole);
  ASSERT_EQ(whole.lrs.size(), 6u);
  ASSERT_EQ(second.lrs.size(), 2u);
  EXPECT_DOUBLE_EQ(second.lrs[0], whole.lrs[4]);
  EXPECT_DOUBLE_EQ(second.lrs[1], whole.lrs[5]);
}

TEST_F(TrainerTest, ClassifierBackwardOncePerStepOrPerMicroBatch) {
  if (world() != 2) GTEST_SKIP() << "two pipeline stages on two ranks";
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
    if (rank() == 0) {
      EXPECT_EQ(remove_tree(run_dir_), "");
    }
    context().all_true(true);
    Recorder recorder(metrics());
    run("max-steps = 3\npipeline-stages = 2\nmicro-batches = 4\npipeline-schedule = " + schedule +
            "\n",
        recorder);
    EXPECT_EQ(recorder.seen, expected_phases(0, 3, schedule == "gpipe" ? 1 : 4)) << schedule;
  }
}

}  // namespace
}  // namespace myriad::testing

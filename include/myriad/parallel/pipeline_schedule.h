#pragma once

#include <string>
#include <vector>

namespace myriad {

// The order of a step's forward and backward passes over the micro-batches (docs/pipeline.md).
// GPipe: every forward, the classifier once on the replica's batch, every backward. 1F1B: each
// stage starts a micro-batch's backward as soon as it can, the classifier runs per micro-batch
// (ShardedMarginSoftmax::begin_parts), and stage s holds min(P - s, M) micro-batches at once.
// Interleaved: Megatron-LM's interleaved 1F1B, where each rank holds v >= 2 chunks of the
// backbone, chunk c of rank s being virtual stage c P + s, so that a micro-batch passes every
// rank v times and the bubble shrinks by about v; the classifier runs per micro-batch as in 1F1B.
enum class PipelineSchedule { kGPipe, k1F1B, kInterleaved };
const char* schedule_name(PipelineSchedule schedule);
// Whether the classifier runs once per micro-batch (ShardedMarginSoftmax::begin_parts), not once on
// the replica's batch.
bool classifier_in_parts(PipelineSchedule schedule);

// Micro-batches whose activations each virtual stage c P + s (chunk c of stage s; one chunk but
// under the interleaved schedule) keeps at once: under GPipe all M, on every stage; under 1F1B
// min(P - s, M) on stage s; interleaved, the most its list ever holds.
std::vector<int64_t> micro_batches_in_flight(PipelineSchedule schedule, int stages,
                                             int micro_batches, int chunks = 1);

// One thing a stage does in a step, on one of its chunks. Transfers go to the neighbouring stages:
// activations (with the samples' keys and ViT's masking order) to the next, their gradients to
// the previous. Interleaved, the next of the last stage is the first (its next chunk's), and the
// previous of the first the last.
enum class ActionKind {
  kForward,         // micro_batch through this stage's blocks (its input received, or its slice)
  kBackward,        // micro_batch's backward, its output's gradient received or from the classifier
  kRecvActivation,  // micro_batch's input, from the previous stage
  kSendActivation,  // micro_batch's output, to the next stage
  kRecvGradient,    // micro_batch's output's gradient, from the next stage
  kSendGradient,    // micro_batch's input's gradient, to the previous stage
  // One transfer with the next stage: micro_batch's output goes, the gradient of `received`'s
  // comes back, so that neither neighbour waits for the other's to arrive first.
  kSendActivationRecvGradient,
  // One transfer with the previous stage: micro_batch's input's gradient goes, `received`'s
  // input comes.
  kSendGradientRecvActivation,
  // The classifier on micro_batch (kWholeBatch: the replica's batch), on every rank of the run:
  // the last stage's samples and every rank's classes. Its collectives span all ranks.
  kClassifier,
  // The next backward is the step's last pass over this stage: its gradient buckets all-reduce
  // among the replicas as they fill.
  kAllReduce,
};

constexpr int kWholeBatch = -1;

struct Action {
  ActionKind kind;
  int micro_batch;
  int received = -1;  // the exchanges' micro-batch that comes in
  int chunk = 0;      // the chunk micro_batch passes (the classifier: none)
  int received_chunk = 0;
};

// Stage `stage`'s actions in one step of `schedule` over `stages` stages of `chunks` chunks each
// (more than one only interleaved) and `micro_batches` micro-batches, in the order it runs them.
// One executor (PipelineEngine) runs any such list; the rules that make the lists of a pipeline's
// stages run together are tests/unit/schedule_test.cpp's.
std::vector<Action> schedule_actions(PipelineSchedule schedule, int stages, int stage,
                                     int micro_batches, int chunks = 1);

// "F 3", "send-act 3", "C whole", "F c1:3" (chunk 1), ..., for messages and tests.
std::string describe(const Action& action);

}  // namespace myriad

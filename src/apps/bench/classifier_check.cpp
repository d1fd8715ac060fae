// myriad-bench classifier-check: one forward and backward of the sharded classifier on a case
// given as HDF5 (features [N, D] float32, labels [N] int64, weight [C, D] float32), with float32
// GEMMs. Rank r takes its balanced slice of the rows and its class shard; rank 0 writes the loss
// and the gathered gradients. Users compare them with any other implementation.

#include <numeric>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/balanced_split.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// A case as this rank holds it: its balanced slice of the rows and its class shard.
struct CheckCase {
  torch::Tensor features, labels, weight;
  std::vector<int64_t> rows;  // every rank's count, for the gather
  int64_t n = 0, classes = 0, dim = 0;
};

// The loss, and the gradients gathered on rank 0 (undefined elsewhere).
struct CheckResult {
  torch::Tensor loss, grad_features, grad_weight;
};

// Reads this rank's part of the case, checking the shapes agree.
CheckCase read_case(const std::string& input, const Communicator& comm) {
  Hdf5File file(input, Hdf5File::Mode::kRead);
  for (const char* name : {"features", "labels", "weight"}) {
    MYRIAD_CHECK(file.has(name), "'{}' has no dataset '{}'", input, name);
  }
  const std::vector<int64_t> f = file.shape("features"), l = file.shape("labels"),
                             w = file.shape("weight");
  MYRIAD_CHECK(f.size() == 2 && l.size() == 1 && w.size() == 2 && f[0] == l[0] && f[1] == w[1],
               "'{}': expected features [N, D], labels [N] and weight [C, D]", input);
  CheckCase c;
  c.n = f[0];
  c.dim = f[1];
  c.classes = w[0];
  c.rows = balanced_counts(c.n, comm.size());
  const int64_t begin = std::accumulate(c.rows.begin(), c.rows.begin() + comm.rank(), int64_t{0});
  c.features = file.read_rows("features", begin, c.rows[comm.rank()]).to(torch::kFloat32);
  c.labels = file.read_rows("labels", begin, c.rows[comm.rank()]).to(torch::kInt64);
  const ClassPartition part(c.classes, comm.size());
  c.weight = file.read_rows("weight", part.offset(comm.rank()), part.size(comm.rank()))
                 .to(torch::kFloat32);
  return c;
}

// One forward and backward of the sharded classifier, with the case's weight as its own.
// Collective.
CheckResult forward_backward(Communicator& comm, const CheckCase& c, const MarginConfig& margin,
                             const torch::Device& device) {
  ShardedSoftmaxOptions o;
  o.num_classes = c.classes;
  o.embedding_size = c.dim;
  o.margin = margin;
  o.update = WeightUpdate::kAccumulateGrad;
  ShardedMarginSoftmax classifier(comm, o, device);
  classifier.weight().copy_(c.weight);
  torch::Tensor x = c.features.to(device).requires_grad_(true);
  CheckResult result;
  result.loss = classifier.forward(x, c.labels.to(device));
  result.loss.backward();
  result.grad_features = comm.gather(x.grad().contiguous(), c.rows, 0);
  result.grad_weight = comm.gather(classifier.weight_grad(), classifier.partition().sizes(), 0);
  return result;
}

// Rank 0's output, which appears whole or not at all, and the line that sums it up.
void write_result(const std::string& output, const CheckCase& c, const CheckResult& result,
                  const MarginConfig& margin, int world_size) {
  AtomicOutput out(output);
  {
    Hdf5File file(out.temporary_path(), Hdf5File::Mode::kCreate);
    file.write("loss", result.loss.detach().cpu());
    file.write("grad_features", result.grad_features.cpu());
    file.write("grad_weight", result.grad_weight.cpu());
    file.set_attribute("/", "margin", margin.describe());
    file.set_attribute("/", "world_size", static_cast<int64_t>(world_size));
  }
  out.commit();
  log_info(
      "classifier-check: {} samples, {} classes, D={}, {} on {} rank(s): loss {:.9f}; wrote {}",
      c.n, c.classes, c.dim, margin.describe(), world_size, result.loss.item<double>(), output);
}

}  // namespace

int run_classifier_check(ProcessContext& context, int argc, char** argv) {
  po::options_description options("classifier-check options");
  std::string input, output, device_name;
  // clang-format off
  options.add_options()
      ("input", po::value(&input)->required(), "HDF5 case: features [N, D] float32, labels [N] int64, weight [C, D] float32")
      ("output", po::value(&output)->required(), "HDF5 written by rank 0: loss, grad_features [N, D], grad_weight [C, D]")
      ("device", po::value(&device_name)->default_value("auto"), "auto, cpu or cuda");
  // clang-format on
  add_margin_options(options);
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np W myriad-bench classifier-check --input case.h5 "
                          "--output out.h5 [margin options]",
                          context.rank())) {
    return kExitOk;
  }
  const MarginConfig margin = margin_from_options(values);
  const torch::Device device = context.select_device(parse_device_preference(device_name));
  CommFactory comms(context);
  Communicator& comm = comms.for_device(device);

  CheckCase c;
  on_every_rank(context, str_format("reading '{}'", input), [&] { c = read_case(input, comm); });
  const CheckResult result = forward_backward(comm, c, margin, device);
  if (context.rank() == 0) write_result(output, c, result, margin, comm.size());
  comm.barrier();
  return kExitOk;
}

}  // namespace myriad

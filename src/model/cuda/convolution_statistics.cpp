#include "convolution_statistics.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "myriad/util/check_cuda.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// cuDNN's refusal to build a graph or plan: a shape it has no engine for, not a failed run.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string cudnn_message(cudnnStatus_t status, const char* what) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  return str_format("cuDNN {}: {} {}", what, cudnnGetErrorString(status), detail);
}

void require(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Unsupported(cudnn_message(status, what));
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    require(cudnnBackendCreateDescriptor(type, &d_), "descriptor");
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  template <class T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  const T* values, int64_t count = 1) {
    require(cudnnBackendSetAttribute(d_, name, type, count, values), "attribute");
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    const cudnnBackendDescriptor_t raw = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw);
  }
  Descriptor& finalize(const char* what) {
    require(cudnnBackendFinalize(d_), what);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// One handle per device for the process's life: destroying it at exit could outlive the driver.
cudnnHandle_t handle_of(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  if (status != CUDNN_STATUS_SUCCESS) MYRIAD_THROW("{}", cudnn_message(status, "cudnnCreate"));
  return handles.emplace(device, handle).first->second;
}

enum Uid : int64_t { kX = 1, kW, kY, kSum, kSumSquares };

// A channels-last [n, c, h, w] tensor (strides of NHWC memory).
Descriptor tensor(Uid uid, cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
  const std::array<int64_t, 4> dims{n, c, h, w};
  const std::array<int64_t, 4> strides{c * h * w, 1, w * c, c};
  const int64_t id = uid, alignment = 16;
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
  t.finalize("tensor");
  return t;
}

Descriptor convolution(const ConvolutionShape& s) {
  const int64_t dims = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::array<int64_t, 2> padding{s.padding, s.padding}, stride{s.stride, s.stride},
      dilation{1, 1};
  Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims)
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, padding.data(), 2)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, padding.data(), 2)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation.data(), 2)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride.data(), 2);
  conv.finalize("convolution");
  return conv;
}

// The finalised operation graph: y = conv(x, w), then Σ y and Σ y² per channel, summed in
// `precision`.
Descriptor operation_graph(const ConvolutionShape& s, cudnnHandle_t handle,
                           cudnnDataType_t precision) {
  const cudnnDataType_t io = s.dtype == torch::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const Descriptor x = tensor(kX, io, s.batch, s.channels, s.height, s.width);
  const Descriptor w = tensor(kW, io, s.out_channels, s.channels, s.kernel, s.kernel);
  const Descriptor y = tensor(kY, io, s.batch, s.out_channels, s.out_height(), s.out_width());
  const Descriptor sum = tensor(kSum, CUDNN_DATA_FLOAT, 1, s.out_channels, 1, 1);
  const Descriptor squares = tensor(kSumSquares, CUDNN_DATA_FLOAT, 1, s.out_channels, 1, 1);
  const Descriptor conv = convolution(s);
  const float alpha = 1.0f, beta = 0.0f;
  Descriptor forward(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  forward.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, &beta);
  forward.finalize("convolution operation");
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  Descriptor stats(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  stats.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, &mode)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, squares);
  stats.finalize("GenStats operation");
  const std::array<cudnnBackendDescriptor_t, 2> ops{forward.get(), stats.get()};
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle)
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(), 2);
  graph.finalize("operation graph");
  return graph;
}

// The engine configurations cuDNN's heuristics rank for `graph`, best first.
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  heuristics.finalize("heuristics");
  int64_t count = 0;
  require(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          "heuristics' count");
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  require(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
          "heuristics' results");
  std::vector<Descriptor> ranked;
  for (int64_t i = 0; i < std::min(returned, count); ++i) ranked.push_back(std::move(configs[i]));
  return ranked;
}

}  // namespace

// An execution plan of one shape's graph, with the workspace it needs.
class ConvolutionStatisticsPlan {
 public:
  ConvolutionStatisticsPlan(ConvolutionShape shape, Descriptor plan, int64_t workspace)
      : shape_(shape), plan_(std::move(plan)), workspace_(workspace) {}

  const ConvolutionShape& shape() const { return shape_; }

  // Sums must start at zero: GenStats may add into them. A failure is an Error, which building a
  // plan takes as cuDNN's refusal and training as the end of the run.
  void run(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y,
           torch::Tensor& sums) const {
    const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(shape_.device));
    const torch::Tensor workspace =
        torch::empty({std::max<int64_t>(workspace_, 1)}, x.options().dtype(torch::kUInt8));
    try {
      execute(variant_pack(
          {x.data_ptr(), w.data_ptr(), y.data_ptr(), sums[0].data_ptr(), sums[1].data_ptr()},
          workspace.data_ptr()));
    } catch (const Unsupported& e) {
      MYRIAD_THROW("convolution with statistics ({}): {}", shape_.to_string(), e.what());
    }
  }

 private:
  static Descriptor variant_pack(const std::array<void*, 5>& pointers, void* workspace) {
    const std::array<int64_t, 5> uids{kX, kW, kY, kSum, kSumSquares};
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), 5)
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(), 5)
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
    pack.finalize("variant pack");
    return pack;
  }

  void execute(const Descriptor& pack) const {
    const cudnnHandle_t handle = handle_of(shape_.device);
    const cudaStream_t stream =
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(shape_.device)).stream();
    static std::mutex mutex;  // the handle's stream is shared state
    const std::lock_guard<std::mutex> lock(mutex);
    require(cudnnSetStream(handle, stream), "stream");
    require(cudnnBackendExecute(handle, plan_.get(), pack.get()), "execute");
  }

  ConvolutionShape shape_;
  Descriptor plan_;
  int64_t workspace_;
};

namespace {

// Finalised plans of `graph`: the first `wanted` configurations that cuDNN's heuristics rank and
// that finalise. Why none did goes to `refusal`.
std::vector<ConvolutionStatisticsPlan> finalised_plans(const ConvolutionShape& s,
                                                       const Descriptor& graph, size_t wanted,
                                                       std::string& refusal) {
  const cudnnHandle_t handle = handle_of(s.device);
  std::vector<ConvolutionStatisticsPlan> plans;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    try {
      for (Descriptor& config : engine_configs(graph, mode)) {
        if (plans.size() == wanted) return plans;
        try {
          Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
          plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle)
              .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config)
              .finalize("execution plan");
          int64_t workspace = 0, returned = 0;
          require(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &returned, &workspace),
                  "workspace size");
          plans.emplace_back(s, std::move(plan), workspace);
        } catch (const Unsupported& e) {
          refusal = e.what();
        }
      }
    } catch (const Unsupported& e) {
      refusal = e.what();
    }
    if (!plans.empty()) return plans;
  }
  return plans;
}

// Plans of the shape's graph, its sums in float32 or else in the maps' own dtype (cuDNN's
// frontend has asked for either): all of them up to kCandidates where LibTorch times cuDNN's
// engines (its benchmark mode), else the first.
std::vector<ConvolutionStatisticsPlan> candidate_plans(const ConvolutionShape& s) {
  // Each may compile kernels at run time: a few, not every configuration.
  constexpr size_t kCandidates = 3;
  const size_t wanted = at::globalContext().benchmarkCuDNN() ? kCandidates : 1;
  const cudnnDataType_t io = s.dtype == torch::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  std::string refusal = "no engine configuration";
  for (const cudnnDataType_t precision : {CUDNN_DATA_FLOAT, io}) {
    try {
      const Descriptor graph = operation_graph(s, handle_of(s.device), precision);
      std::vector<ConvolutionStatisticsPlan> plans = finalised_plans(s, graph, wanted, refusal);
      if (!plans.empty()) return plans;
    } catch (const Unsupported& e) {
      refusal = e.what();
    }
  }
  throw Unsupported(refusal);
}

ConvolutionWithSums empty_outputs(const ConvolutionShape& s, const torch::Tensor& x) {
  torch::Tensor y = torch::empty({s.batch, s.out_channels, s.out_height(), s.out_width()},
                                 x.options().memory_format(torch::MemoryFormat::ChannelsLast));
  return {y, torch::zeros({2, s.out_channels}, x.options().dtype(torch::kFloat32))};
}

// A CUDA event, destroyed with its owner.
class Event {
 public:
  Event() { MYRIAD_CHECK_CUDA(cudaEventCreate(&e_)); }
  ~Event() { (void)cudaEventDestroy(e_); }  // nothing to do about a failure here
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Milliseconds of 3 runs of `plan` after one.
float time_plan(const ConvolutionStatisticsPlan& plan, const torch::Tensor& x,
                const torch::Tensor& w, ConvolutionWithSums& out) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  plan.run(x, w, out.y, out.sums);
  const Event start, stop;
  MYRIAD_CHECK_CUDA(cudaEventRecord(start.get(), stream));
  for (int k = 0; k < 3; ++k) plan.run(x, w, out.y, out.sums);
  MYRIAD_CHECK_CUDA(cudaEventRecord(stop.get(), stream));
  MYRIAD_CHECK_CUDA(cudaEventSynchronize(stop.get()));
  float ms = 0;
  MYRIAD_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

// The fastest of `plans` that run, each run on x and w (the first use's own inputs: no memory
// beyond what the convolution takes anyway); a lone plan runs once, untimed. A plan that fails to
// run counts as none; where none runs, the last failure is the refusal.
ConvolutionStatisticsPlan fastest(std::vector<ConvolutionStatisticsPlan> plans,
                                  const torch::Tensor& x, const torch::Tensor& w) {
  ConvolutionWithSums out = empty_outputs(plans.front().shape(), x);
  std::optional<size_t> best;
  float best_ms = 0;
  std::string failure;
  for (size_t i = 0; i < plans.size(); ++i) {
    try {
      const float ms = plans.size() == 1 ? (plans[i].run(x, w, out.y, out.sums), 0.0f)
                                         : time_plan(plans[i], x, w, out);
      if (!best || ms < best_ms) best = i, best_ms = ms;
    } catch (const Error& e) {
      // A CUDA error that sticks ends the process's use of the GPU: no refusal, the run's end.
      if (cudaPeekAtLastError() != cudaSuccess) throw;
      failure = e.what();
    }
  }
  if (!best) throw Unsupported(failure);
  return std::move(plans[*best]);
}

struct Registry {
  std::mutex mutex;
  std::map<ConvolutionShape, std::unique_ptr<ConvolutionStatisticsPlan>> plans;  // null: none
  ConvolutionStatisticsReport report;
};

// Never destroyed, as the handles: the plans must not outlive the driver at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

bool capturing(int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MYRIAD_CHECK_CUDA(cudaStreamIsCapturing(
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

std::unique_ptr<ConvolutionStatisticsPlan> build_plan(const ConvolutionShape& s,
                                                      const torch::Tensor& x,
                                                      const torch::Tensor& w,
                                                      ConvolutionStatisticsReport& report) {
  const auto start = std::chrono::steady_clock::now();
  try {
    std::vector<ConvolutionStatisticsPlan> plans = candidate_plans(s);
    const size_t candidates = plans.size();
    auto plan = std::make_unique<ConvolutionStatisticsPlan>(fastest(std::move(plans), x, w));
    ++report.planned;
    report.build_seconds += seconds_since(start);
    log_debug("the convolution {} forms its sums in cuDNN: {} plan(s) built and run in {:.0f} ms",
              s.to_string(), candidates, 1e3 * seconds_since(start));
    return plan;
  } catch (const Unsupported& e) {
    ++report.unplanned;
    report.build_seconds += seconds_since(start);
    if (report.first_reason.empty()) report.first_reason = e.what();
    log_info(
        "the convolution {} forms no batch-norm statistics in cuDNN ({}); its batch norm "
        "reads the output once more",
        s.to_string(), e.what());
    return nullptr;
  }
}

}  // namespace

bool ConvolutionShape::operator<(const ConvolutionShape& o) const {
  const auto key = [](const ConvolutionShape& s) {
    return std::make_tuple(s.device, static_cast<int>(s.dtype), s.batch, s.channels, s.height,
                           s.width, s.out_channels, s.kernel, s.stride, s.padding);
  };
  return key(*this) < key(o);
}

std::string ConvolutionShape::to_string() const {
  return str_format("{}x{}x{}x{} -> {} channels, {}x{} kernel, stride {}, padding {}, {}", batch,
                    channels, height, width, out_channels, kernel, kernel, stride, padding,
                    c10::toString(dtype));
}

const ConvolutionStatisticsPlan* convolution_statistics_plan(const ConvolutionShape& shape,
                                                             const torch::Tensor& x,
                                                             const torch::Tensor& weight) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.plans.find(shape);
  if (it == r.plans.end()) {
    if (capturing(shape.device)) return nullptr;
    it = r.plans.emplace(shape, build_plan(shape, x, weight, r.report)).first;
  }
  return it->second.get();
}

ConvolutionWithSums run_convolution_statistics(const ConvolutionStatisticsPlan& plan,
                                               const torch::Tensor& x,
                                               const torch::Tensor& weight) {
  ConvolutionWithSums out = empty_outputs(plan.shape(), x);
  plan.run(x, weight, out.y, out.sums);
  return out;
}

ConvolutionStatisticsReport convolution_statistics_report() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.report;
}

std::string loaded_cudnn_version() {
  const size_t v = cudnnGetVersion();
  return str_format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100);
}

}  // namespace myriad

#include "mpi_types.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <mutex>

#include "myriad/util/check_mpi.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

struct HalfRegistry {
  std::mutex mutex;
  int leases = 0;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype fp16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
  MPI_Op max = MPI_OP_NULL;
  MPI_Op min = MPI_OP_NULL;
};

HalfRegistry& registry() {
  static HalfRegistry r;
  return r;
}

template <class T, class Combine>
void combine_pairs(const void* in, void* inout, int length, Combine combine) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < length; ++i) {
    b[i] = static_cast<T>(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

template <class Combine>
void combine_half(void* in, void* inout, int* length, MPI_Datatype* type, Combine combine) {
  if (*type == registry().bf16) {
    combine_pairs<c10::BFloat16>(in, inout, *length, combine);
  } else {
    combine_pairs<c10::Half>(in, inout, *length, combine);
  }
}

void half_sum(void* in, void* inout, int* length, MPI_Datatype* type) {
  combine_half(in, inout, length, type, [](float a, float b) { return a + b; });
}
void half_max(void* in, void* inout, int* length, MPI_Datatype* type) {
  combine_half(in, inout, length, type, [](float a, float b) { return std::max(a, b); });
}
void half_min(void* in, void* inout, int* length, MPI_Datatype* type) {
  combine_half(in, inout, length, type, [](float a, float b) { return std::min(a, b); });
}

}  // namespace

HalfTypesLease::HalfTypesLease() {
  HalfRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.leases++ > 0) return;
  MYRIAD_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &r.bf16));
  MYRIAD_CHECK_MPI(MPI_Type_commit(&r.bf16));
  MYRIAD_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &r.fp16));
  MYRIAD_CHECK_MPI(MPI_Type_commit(&r.fp16));
  MYRIAD_CHECK_MPI(MPI_Op_create(&half_sum, 1, &r.sum));
  MYRIAD_CHECK_MPI(MPI_Op_create(&half_max, 1, &r.max));
  MYRIAD_CHECK_MPI(MPI_Op_create(&half_min, 1, &r.min));
}

HalfTypesLease::~HalfTypesLease() {
  HalfRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (--r.leases > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Type_free(&r.bf16);
  MPI_Type_free(&r.fp16);
  MPI_Op_free(&r.sum);
  MPI_Op_free(&r.max);
  MPI_Op_free(&r.min);
}

MPI_Datatype mpi_datatype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return MPI_DOUBLE;
    case torch::kFloat32:
      return MPI_FLOAT;
    case torch::kBFloat16:
      return registry().bf16;
    case torch::kFloat16:
      return registry().fp16;
    case torch::kInt64:
      return MPI_INT64_T;
    case torch::kInt32:
      return MPI_INT32_T;
    case torch::kUInt8:
      return MPI_UINT8_T;
    case torch::kInt8:
      return MPI_INT8_T;
    default:
      MYRIAD_THROW("no MPI datatype for {}", c10::toString(dtype));
  }
}

MPI_Op mpi_reduce_op(ReduceOp op, torch::ScalarType dtype) {
  const bool half = dtype == torch::kBFloat16 || dtype == torch::kFloat16;
  switch (op) {
    case ReduceOp::kSum:
      return half ? registry().sum : MPI_SUM;
    case ReduceOp::kMax:
      return half ? registry().max : MPI_MAX;
    case ReduceOp::kMin:
      return half ? registry().min : MPI_MIN;
  }
  MYRIAD_THROW("unknown reduction");
}

}  // namespace myriad

#include "bench_common.h"

namespace myriad {

RankSpread spread_over_ranks(double value, const ProcessContext& context) {
  RankSpread s;
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.min, 1, MPI_DOUBLE, MPI_MIN, context.world()));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.max, 1, MPI_DOUBLE, MPI_MAX, context.world()));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.avg, 1, MPI_DOUBLE, MPI_SUM, context.world()));
  s.avg /= context.size();
  return s;
}

}  // namespace myriad

#pragma once

#include "myriad/model/batch_norm.h"

namespace myriad::testing {

// Batch norm's statistics from cuDNN's convolutions (--conv-statistics on) while it lives, then the
// process's default (off) again, also where a failed assertion leaves the test early.
class ConvolutionStatisticsOn {
 public:
  ConvolutionStatisticsOn() { use_convolution_statistics(true); }
  ~ConvolutionStatisticsOn() { use_convolution_statistics(false); }
  ConvolutionStatisticsOn(const ConvolutionStatisticsOn&) = delete;
  ConvolutionStatisticsOn& operator=(const ConvolutionStatisticsOn&) = delete;
};

}  // namespace myriad::testing

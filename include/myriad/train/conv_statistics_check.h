#pragma once

#include <functional>
#include <string>

#include "myriad/comm/process_context.h"
#include "myriad/model/batch_norm.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"

namespace myriad {

// Which convolutions formed their batch norm's statistics is known only once the first step has
// met every shape (cuDNN may refuse any). After the first step this process takes, one line says
// so, with the seconds that building their plans took; under --conv-statistics on, a
// run where no rank's convolution formed them stops there with an error that says why (collective).
class ConvStatisticsCheck : public StepObserver {
 public:
  using ReportSource = std::function<ConvolutionStatisticsReport()>;
  // `active`: the run asked for the sums (convolution_statistics); `backbone` names the network;
  // `source` gives this rank's report.
  ConvStatisticsCheck(const ProcessContext& context, Toggle mode, bool active, std::string backbone,
                      ReportSource source = convolution_statistics_report);
  void step_finished(const StepEnd&) override;

 private:
  const ProcessContext& context_;
  bool required_;
  bool pending_;
  std::string backbone_;
  ReportSource source_;
};

// Why no convolution formed its batch norm's statistics, by `report` (this rank's, after the first
// step); "" where one did.
std::string conv_statistics_shortfall(const ConvolutionStatisticsReport& report,
                                      const std::string& backbone);

}  // namespace myriad

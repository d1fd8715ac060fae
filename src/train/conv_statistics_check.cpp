#include "myriad/train/conv_statistics_check.h"

#include <utility>

#include "myriad/util/error.h"
#include "myriad/util/log.h"

namespace myriad {

ConvStatisticsCheck::ConvStatisticsCheck(const ProcessContext& context, Toggle mode, bool active,
                                         std::string backbone, ReportSource source)
    : context_(context),
      required_(mode == Toggle::kOn),
      pending_(active),
      backbone_(std::move(backbone)),
      source_(std::move(source)) {}

void ConvStatisticsCheck::step_finished(const StepEnd&) {
  if (!pending_) return;
  pending_ = false;
  const ConvolutionStatisticsReport report = source_();
  const std::string shortfall = conv_statistics_shortfall(report, backbone_);
  // A pipeline stage may hold no such convolution: `on` fails only where no rank formed any.
  if (required_ && context_.all_true(!shortfall.empty())) {
    MYRIAD_THROW_COLLECTIVE("--conv-statistics on: {}; run with --conv-statistics auto or off",
                            shortfall);
  }
  if (report.planned + report.unplanned == 0) {
    log_info("batch norms take no statistics from cuDNN's convolutions: {}", shortfall);
  } else {
    log_info(
        "batch-norm statistics from cuDNN's convolutions: {}; their plans took {:.1f} s to "
        "build, once",
        convolution_statistics_state(), report.build_seconds);
  }
}

std::string conv_statistics_shortfall(const ConvolutionStatisticsReport& report,
                                      const std::string& backbone) {
  if (report.planned > 0) return "";
  if (report.unplanned > 0) {
    return str_format("cuDNN formed them for none of the {} convolution shapes it was given ({})",
                      report.unplanned, report.first_reason);
  }
  return str_format(
      "no convolution of {} feeds a batch norm through cuDNN's graph (the iresnet backbones' do)",
      backbone);
}

}  // namespace myriad

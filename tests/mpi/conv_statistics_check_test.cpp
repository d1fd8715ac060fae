// ConvStatisticsCheck after the first step: --conv-statistics on stops every rank where no rank's
// convolution formed its batch norm's statistics, and names why; a pipeline stage without such
// convolutions is no refusal while another rank formed them; auto, and runs that never asked,
// go on.
#include <string>

#include "mpi_test.h"
#include "myriad/train/conv_statistics_check.h"
#include "myriad/util/error.h"

namespace myriad::testing {
namespace {

class ConvStatisticsCheckTest : public MpiTest {
 protected:
  // The error step_finished raises on this rank: "" where it raises none.
  static std::string error_of(ConvStatisticsCheck& check) {
    const torch::Tensor loss;
    try {
      check.step_finished({0, 10, 0, loss, 0.1});
      return "";
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective()) << e.message();
      return e.message();
    }
  }
  static ConvStatisticsCheck::ReportSource reporting(ConvolutionStatisticsReport report) {
    return [report] { return report; };
  }
};

TEST_F(ConvStatisticsCheckTest, OnStopsEveryRankWhereNoRankFormedTheSums) {
  ConvolutionStatisticsReport refused;
  refused.unplanned = 3;
  refused.first_reason = "cuDNN finalize: CUDNN_STATUS_NOT_SUPPORTED";
  ConvStatisticsCheck required(context(), Toggle::kOn, true, "iresnet50", reporting(refused));
  EXPECT_EQ(error_of(required),
            "--conv-statistics on: cuDNN formed them for none of the 3 convolution shapes it was "
            "given (cuDNN finalize: CUDNN_STATUS_NOT_SUPPORTED); run with --conv-statistics auto "
            "or off");
  // Once, after the first step only.
  EXPECT_EQ(error_of(required), "");

  ConvStatisticsCheck unfitting(context(), Toggle::kOn, true, "mbf",
                                reporting(ConvolutionStatisticsReport()));
  EXPECT_EQ(error_of(unfitting),
            "--conv-statistics on: no convolution of mbf feeds a batch norm through cuDNN's graph "
            "(the iresnet backbones' do); run with --conv-statistics auto or off");
}

TEST_F(ConvStatisticsCheckTest, AutoAndRunsThatFormedSomeGoOn) {
  ConvolutionStatisticsReport refused;
  refused.unplanned = 2;
  refused.first_reason = "no engine";
  ConvStatisticsCheck automatic(context(), Toggle::kAuto, true, "iresnet50", reporting(refused));
  EXPECT_EQ(error_of(automatic), "");
  ConvStatisticsCheck inactive(context(), Toggle::kOn, false, "iresnet50", reporting(refused));
  EXPECT_EQ(error_of(inactive), "");

  // Rank 0 formed some: the other ranks, as pipeline stages without such convolutions, go on.
  ConvolutionStatisticsReport formed = refused;
  formed.planned = 1;
  ConvStatisticsCheck staged(context(), Toggle::kOn, true, "iresnet50",
                             reporting(rank() == 0 ? formed : ConvolutionStatisticsReport()));
  EXPECT_EQ(error_of(staged), "");
}

TEST_F(ConvStatisticsCheckTest, ShortfallNamesCudnnsRefusalOrTheBackbone) {
  ConvolutionStatisticsReport report;
  EXPECT_EQ(conv_statistics_shortfall(report, "small_cnn"),
            "no convolution of small_cnn feeds a batch norm through cuDNN's graph (the iresnet "
            "backbones' do)");
  report.unplanned = 1;
  report.first_reason = "why";
  EXPECT_EQ(conv_statistics_shortfall(report, "iresnet18"),
            "cuDNN formed them for none of the 1 convolution shapes it was given (why)");
  report.planned = 1;
  EXPECT_EQ(conv_statistics_shortfall(report, "iresnet18"), "");
}

}  // namespace
}  // namespace myriad::testing

// myriad-data from-ijb: IJB-B or IJB-C as insightface distributes them (loose crops, five
// landmarks each, templates, medias and the 1:1 template pairs) into the IJB evaluation file
// (docs/data-format.md): every crop aligned to the ArcFace 112x112 template, as insightface's
// evaluation aligns it.

#include <algorithm>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/ijb_conversion.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"

namespace myriad {

int run_from_ijb(ProcessContext& context, int argc, char** argv) {
  po::options_description options("from-ijb options");
  IjbConversion conversion;
  std::string target;
  // clang-format off
  options.add_options()
      ("input", po::value(&conversion.root)->required(), "insightface's IJB directory, holding meta/ and loose_crop/ (also the first positional argument)")
      ("target", po::value(&target)->required(), "IJBC or IJBB")
      ("output", po::value(&conversion.output)->required(), "HDF5 file to write")
      ("workers", po::value(&conversion.workers)->default_value(0), "threads decoding and aligning images (0: all cores)");
  // clang-format on
  po::positional_options_description positional;
  positional.add("input", 1);
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data from-ijb ROOT --target IJBC|IJBB --output X.h5",
                          context.rank(), &positional)) {
    return kExitOk;
  }
  conversion.target = parse_ijb_target(target);
  if (conversion.workers <= 0)
    conversion.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const IjbConversionSummary s = convert_ijb(conversion);
  log_info(
      "wrote {}: {} aligned faces 112x112x3 ({}), {} templates, {} pairs ({} genuine); "
      "faces decoded, aligned and written in {:.1f} s: {:.0f} images/s on {} workers",
      conversion.output, s.images, kIjbAlignment, s.templates, s.pairs, s.genuine, s.align_seconds,
      s.images / s.align_seconds, conversion.workers);
  return kExitOk;
}

}  // namespace myriad

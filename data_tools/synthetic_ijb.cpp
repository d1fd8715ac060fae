// myriad-data synthetic-ijb: a synthetic set in insightface's IJB layout (loose JPEG crops, five
// landmarks each, templates of medias, 1:1 template pairs) whose faces are prototype views, for
// tests and benchmarks of from-ijb and of the IJB evaluation (docs/data-format.md).

#include <algorithm>
#include <chrono>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/synthetic_ijb.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"

namespace myriad {

int run_synthetic_ijb(ProcessContext& context, int argc, char** argv) {
  po::options_description options("synthetic-ijb options");
  SyntheticIjbOptions o;
  std::string output, target = "IJBC";
  // clang-format off
  options.add_options()
      ("output", po::value(&output)->required(), "directory to create (ROOT/meta, ROOT/loose_crop)")
      ("target", po::value(&target)->default_value(target), "IJBC or IJBB: the meta files' prefix")
      ("identities", count_option(&o.identities), "identities; 0: IJB-C's subjects per template (3,531 of 23,124), at least 2")
      ("templates", count_option(&o.templates), "templates, each of one identity, at least two per identity")
      ("images", count_option(&o.images), "images (loose crops), at least one per template")
      ("pairs", count_option(&o.pairs), "template pairs")
      ("genuine-fraction", real_option(&o.genuine_fraction), "the share of genuine pairs (default IJB-C's: 19,557 of 15,658,489)")
      ("noise", real_option(&o.noise), "per-pixel noise of the faces, standard deviation in grey levels")
      ("seed", po::value(&o.seed)->default_value(0), "seed")
      ("workers", po::value(&o.workers)->default_value(0), "threads rendering and encoding crops (0: all cores)");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data synthetic-ijb --output ROOT [--target IJBC|IJBB] "
                          "[--identities K] [--templates T] [--images N] [--pairs P] [--seed S]",
                          context.rank())) {
    return kExitOk;
  }
  o.target = parse_ijb_target(target);
  if (o.workers <= 0)
    o.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto start = std::chrono::steady_clock::now();
  const SyntheticIjb set(o);
  set.write(output);
  const double seconds = seconds_since(start);
  log_info(
      "wrote {} ({}): {} loose crops of {} identities in {} templates ({} medias), {} pairs "
      "({} genuine) in {:.1f} s; {:.0f} images/s on {} workers",
      output, ijb_target_name(o.target), o.images, set.identities(), o.templates, set.medias(),
      o.pairs, set.genuine_pairs(), seconds, o.images / seconds, o.workers);
  return kExitOk;
}

}  // namespace myriad

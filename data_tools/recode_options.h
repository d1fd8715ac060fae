#pragma once

#include <string>

#include "myriad/data/image_recoder.h"
#include "myriad/util/cli.h"

namespace myriad {

// --resize, --resize-mode, --encoding and --jpeg-quality, as the converters that may decode and
// store images again (from-folder, from-rec) take them.
struct RecodeText {
  std::string resize, resize_mode = "crop", encoding = "jpeg";
  int jpeg_quality = 95;
};

void add_recode_options(po::options_description& options, RecodeText& text);

// The options, checked: --resize-mode, --encoding and --jpeg-quality need --resize or `align`
// (from-folder --landmarks), which excludes --resize. A UsageError otherwise.
RecodeOptions parse_recode_options(const po::variables_map& values, const RecodeText& text,
                                   bool align, int channels);

}  // namespace myriad

#pragma once

#include "myriad/train/train_config.h"
#include "options.h"

namespace myriad {

// --model-table: the model over GPU counts and class counts on the machine `o` describes.
// Every rank computes it (a bad option fails them all alike); rank 0 prints it.
void print_model_table(TrainConfig config, const DoctorOptions& o, int rank);

}  // namespace myriad

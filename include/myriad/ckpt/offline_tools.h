#pragma once

#include <string>

namespace myriad {

// Offline operations on a checkpoint's classifier (myriad-ckpt; export-backbone is in
// train/checkpoint_backbone.h). Each verifies the checkpoint first and writes its output under a
// temporary name, renamed into place when complete.

// All classifier shards as one HDF5 file: /weight [C, D] float32 in class order, with attributes
// num_classes, embedding_size and step.
void merge_classifier(const std::string& checkpoint, const std::string& output);

// The same checkpoint split for `world_size` ranks: the replicated state copied, the classifier
// rows and their optimizer state re-split, a new manifest. Random states are not carried (a run
// on the new world size reseeds them).
void reshard_checkpoint(const std::string& checkpoint, const std::string& output, int world_size);

}  // namespace myriad

#pragma once

// No LibTorch here so that nvcc can include it.

namespace myriad {

// What a classifier row's gradient is taken with respect to, for the optimizer's update.
enum class RowGradient {
  kRow,      // the stored row w itself (plain softmax)
  kUnitRow,  // w / |w| (margins normalise the rows)
  // w / |w|, divided once more by |w|: the GEMMs ran on the stored rows and each class's logits
  // were scaled by 1/|w| afterwards, which scales its gradient too.
  kUnitRowOverNorm,
};

}  // namespace myriad

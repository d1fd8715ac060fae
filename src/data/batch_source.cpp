#include "myriad/data/batch_source.h"

namespace myriad {

ResidentBatch::ResidentBatch(Batch first, std::shared_ptr<const DistributedSampler> sampler,
                             const torch::Device& device)
    : batch_(std::move(first)), sampler_(std::move(sampler)) {
  if (batch_.images.defined()) batch_.images = batch_.images.to(device);
  if (batch_.labels.defined()) batch_.labels = batch_.labels.to(device);
}

Batch ResidentBatch::next() {
  Batch b = batch_;
  batch_.index += 1;
  batch_.position = batch_.next;
  batch_.next = sampler_->advance(batch_.next, 1);
  return b;
}

}  // namespace myriad

#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace myriad {

// The protocol of an IJB-B/C evaluation file (docs/data-format.md, "IJB evaluation files"), its
// images aside: which template and media each image belongs to, its detector score, and the
// template pairs to verify, validated and indexed for ijb_protocol.h. CPU tensors.
struct IjbSet {
  std::string target;          // the ijb_target attribute: IJBC or IJBB
  torch::Tensor templates;     // int64 [N]: each image's template id
  torch::Tensor medias;        // int64 [N]: each image's media id
  torch::Tensor scores;        // float32 [N]: each image's detector score, finite
  torch::Tensor labels;        // int64 [P]: 1 where the pair shows one identity, else 0
  torch::Tensor template_ids;  // int64 [T]: the distinct template ids, ascending
  torch::Tensor image_rows;    // int64 [N]: each image's row of template_ids
  torch::Tensor pair_rows;     // int64 [P, 2]: each pair's rows of template_ids
  int64_t genuine = 0;         // pairs labelled 1
  int64_t impostors = 0;       // pairs labelled 0

  int64_t images() const { return templates.size(0); }
  int64_t pairs() const { return labels.size(0); }
};

// Reads and checks `path`: every dataset present with its dtype and length, finite scores, labels
// of 0 and 1, both kinds of pair, and an image for every template a pair names. Each failure is
// one Error naming the file and what is wrong.
IjbSet read_ijb_set(const std::string& path);

}  // namespace myriad

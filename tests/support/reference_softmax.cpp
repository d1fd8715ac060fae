#include "reference_softmax.h"

#include <cmath>

namespace myriad::testing {

ReferenceResult reference_softmax(const torch::Tensor& features, const torch::Tensor& labels,
                                  const torch::Tensor& weight, const MarginConfig& margin,
                                  const torch::Tensor& active) {
  torch::AutoGradMode grad_mode(true);
  torch::Tensor x = features.to(torch::kFloat64).detach().requires_grad_(true);
  torch::Tensor w = weight.to(torch::kFloat64).detach().requires_grad_(true);
  torch::Tensor y = labels.to(torch::kInt64);
  torch::Tensor used = w;
  if (active.defined()) {
    used = w.index_select(0, active);
    // Labels become positions among the active classes (all targets are active).
    y = torch::searchsorted(active, y);
  }
  torch::Tensor logits;
  if (margin.type == MarginType::kSoftmax) {
    logits = x.matmul(used.t());
  } else {
    const torch::Tensor cosine =
        (x / x.norm(2, 1, true)).matmul((used / used.norm(2, 1, true)).t());
    const torch::Tensor target = cosine.gather(1, y.unsqueeze(1));
    const torch::Tensor theta = torch::acos(target);
    const torch::Tensor phi = theta * margin.m1 + margin.m2;
    const torch::Tensor k = torch::floor(phi.detach() / M_PI);
    const torch::Tensor sign = 1.0 - 2.0 * torch::remainder(k, 2.0);
    torch::Tensor psi = sign * torch::cos(phi) - 2.0 * k - margin.m3;
    if (margin.straight_through) psi = target + (psi - target).detach();
    const torch::Tensor one_hot = torch::zeros_like(cosine).scatter_(1, y.unsqueeze(1), 1.0);
    logits = margin.scale * (cosine + one_hot * (psi - target));
  }
  const torch::Tensor loss = torch::nll_loss(torch::log_softmax(logits, 1), y);
  loss.backward();
  return {loss.detach(), x.grad(), w.grad(), logits.detach()};
}

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor da = a.detach().cpu().to(torch::kFloat64);
  const torch::Tensor db = b.detach().cpu().to(torch::kFloat64);
  const double denom = db.norm().item<double>();
  const double diff = (da - db).norm().item<double>();
  return denom == 0.0 ? diff : diff / denom;
}

}  // namespace myriad::testing

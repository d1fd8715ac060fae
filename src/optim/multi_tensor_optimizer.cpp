#include "myriad/optim/multi_tensor_optimizer.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "myriad/optim/optimizer_state.h"

namespace myriad {

namespace {

// The parameters of `group` that have a gradient, and those gradients.
struct Active {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
};

Active active_parameters(const torch::optim::OptimizerParamGroup& group) {
  Active a;
  for (const torch::Tensor& p : group.params()) {
    if (!p.grad().defined()) continue;
    a.params.push_back(p);
    a.grads.push_back(p.grad());
  }
  return a;
}

torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

// Whether the host must skip: reads `overflow` (a synchronisation with the device).
bool overflowed(const torch::Tensor& overflow) {
  return overflow.defined() && overflow.item<float>() > 0;
}

// AdamW's parameters stepped together: those that have taken the same number of steps (all of
// them, unless some had no gradient on some step), since the bias corrections depend on it.
struct Cohort {
  std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq;
};

// `a`'s parameters by the step each takes now (its count advanced, its state created at the
// first), with their gradients and moments passed through `layout` (what a kernel needs of them).
template <class Layout>
std::map<int64_t, Cohort> adamw_cohorts(torch::optim::Optimizer& optimizer, const Active& a,
                                        Layout layout) {
  std::map<int64_t, Cohort> cohorts;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const torch::Tensor& p = a.params[i];
    auto* state = static_cast<torch::optim::AdamWParamState*>(find_param_state(optimizer, p));
    if (state == nullptr) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      state = fresh.get();
      set_param_state(optimizer, p, std::move(fresh));
    }
    state->exp_avg(layout(state->exp_avg(), p));
    state->exp_avg_sq(layout(state->exp_avg_sq(), p));
    state->step(state->step() + 1);
    Cohort& c = cohorts[state->step()];
    c.params.push_back(p);
    c.grads.push_back(layout(a.grads[i], p));
    c.exp_avg.push_back(state->exp_avg());
    c.exp_avg_sq.push_back(state->exp_avg_sq());
  }
  return cohorts;
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define MYRIAD_HAVE_FUSED_OPTIMIZERS 1

// The fused kernels take a parameter and its gradient and state in one layout: the parameter's.
torch::Tensor in_layout_of(const torch::Tensor& t, const torch::Tensor& p) {
  return t.strides() == p.strides() ? t
                                    : torch::empty_like(p, torch::MemoryFormat::Preserve).copy_(t);
}

std::optional<torch::Tensor> found_inf_of(const torch::Tensor& overflow) {
  return overflow.defined() ? std::optional<torch::Tensor>(overflow) : std::nullopt;
}

// ATen's fused SGD on GPUs: true when it took the step. Parameters without momentum state get
// zeroed buffers, which the kernel then treats as LibTorch treats a first step (buffer = gradient)
// only when there is no dampening; with dampening such a step goes the multi-tensor way.
bool fused_sgd_step(torch::optim::Optimizer& optimizer, const torch::optim::SGDOptions& o,
                    Active& a, const torch::Tensor& overflow) {
  if (!a.params.front().is_cuda()) return false;
  for (size_t i = 0; i < a.params.size(); ++i) a.grads[i] = in_layout_of(a.grads[i], a.params[i]);
  std::vector<torch::Tensor> buffers;
  if (o.momentum() != 0) {
    for (const torch::Tensor& p : a.params) {
      auto* state = static_cast<torch::optim::SGDParamState*>(find_param_state(optimizer, p));
      if (state == nullptr && o.dampening() != 0) return false;
    }
    for (const torch::Tensor& p : a.params) {
      auto* state = static_cast<torch::optim::SGDParamState*>(find_param_state(optimizer, p));
      if (state == nullptr) {
        auto fresh = std::make_unique<torch::optim::SGDParamState>();
        fresh->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        buffers.push_back(fresh->momentum_buffer());
        set_param_state(optimizer, p, std::move(fresh));
      } else {
        if (state->momentum_buffer().strides() != p.strides())
          state->momentum_buffer(in_layout_of(state->momentum_buffer(), p));
        buffers.push_back(state->momentum_buffer());
      }
    }
  }
  at::_fused_sgd_(a.params, a.grads, buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                  o.nesterov(), /*maximize=*/false, /*is_first_step=*/false,
                  /*grad_scale=*/std::nullopt, found_inf_of(overflow));
  return true;
}
#endif

}  // namespace

torch::Tensor MultiTensorSgd::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  step_unless({});
  return loss;
}

void MultiTensorSgd::step_unless(const torch::Tensor& overflow) {
  torch::NoGradGuard no_grad;
  bool checked = false;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    Active a = active_parameters(group);
    if (a.params.empty()) continue;
#ifdef MYRIAD_HAVE_FUSED_OPTIMIZERS
    if (fused_sgd_step(*this, o, a, overflow)) continue;
#endif
    if (!checked && overflowed(overflow)) return;
    checked = true;
    if (o.weight_decay() != 0) torch::_foreach_add_(a.grads, a.params, o.weight_decay());
    std::vector<torch::Tensor> update = a.grads;
    if (o.momentum() != 0) {
      // LibTorch's first step starts the buffer as a copy of the gradient; later steps decay it.
      std::vector<torch::Tensor> buffers, decayed_buffers, decayed_grads;
      buffers.reserve(a.params.size());
      for (size_t i = 0; i < a.params.size(); ++i) {
        auto* state =
            static_cast<torch::optim::SGDParamState*>(find_param_state(*this, a.params[i]));
        if (state == nullptr) {
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(torch::clone(a.grads[i]).detach());
          buffers.push_back(fresh->momentum_buffer());
          set_param_state(*this, a.params[i], std::move(fresh));
        } else {
          buffers.push_back(state->momentum_buffer());
          decayed_buffers.push_back(buffers.back());
          decayed_grads.push_back(a.grads[i]);
        }
      }
      if (!decayed_buffers.empty()) {
        torch::_foreach_mul_(decayed_buffers, o.momentum());
        torch::_foreach_add_(decayed_buffers, decayed_grads, 1.0 - o.dampening());
      }
      if (o.nesterov()) {
        torch::_foreach_add_(a.grads, buffers, o.momentum());
      } else {
        update = buffers;
      }
    }
    torch::_foreach_add_(a.params, update, -o.lr());
  }
}

torch::Tensor MultiTensorAdamW::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  step_unless({});
  return loss;
}

void MultiTensorAdamW::settle() {
  if (!skipped_.defined()) return;
  const int64_t skipped = skipped_.item<int64_t>();
  for (const torch::Tensor& p : window_) {
    auto* state = static_cast<torch::optim::AdamWParamState*>(find_param_state(*this, p));
    if (state != nullptr && skipped > 0) state->step(state->step() - skipped);
  }
  skipped_.zero_();
}

bool MultiTensorAdamW::fused_step(const torch::Tensor& overflow) {
#ifdef MYRIAD_HAVE_FUSED_OPTIMIZERS
  std::vector<Active> groups;
  std::vector<torch::Tensor> stepped;
  for (auto& group : param_groups()) {
    groups.push_back(active_parameters(group));
    stepped.insert(stepped.end(), groups.back().params.begin(), groups.back().params.end());
  }
  if (stepped.empty() || !stepped.front().is_cuda()) return false;
  // The device's skip count holds for the parameters stepped since settle(): another set (one
  // without a gradient this step) settles first.
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) { return a.is_same(b); };
  if (!std::equal(stepped.begin(), stepped.end(), window_.begin(), window_.end(), same)) {
    settle();
    window_ = stepped;
  }
  if (!skipped_.defined())
    skipped_ = torch::zeros({1}, stepped.front().options().dtype(torch::kFloat32));
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups()[g].options());
    TORCH_CHECK(!o.amsgrad(), "MultiTensorAdamW does not implement amsgrad");
    const std::map<int64_t, Cohort> cohorts = adamw_cohorts(*this, groups[g], in_layout_of);
    for (const auto& [step, c] : cohorts) {
      // The kernel reads each parameter's step from the device: the host's count less the skips.
      const torch::Tensor device_step = skipped_.neg().add_(static_cast<double>(step));
      at::_fused_adamw_(c.params, c.grads, c.exp_avg, c.exp_avg_sq, /*max_exp_avg_sqs=*/{},
                        std::vector<torch::Tensor>(c.params.size(), device_step), o.lr(),
                        std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                        /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                        found_inf_of(overflow));
    }
  }
  if (overflow.defined()) skipped_.add_(overflow);
  return true;
#else
  (void)overflow;
  return false;
#endif
}

void MultiTensorAdamW::step_unless(const torch::Tensor& overflow) {
  torch::NoGradGuard no_grad;
  if (fused_step(overflow)) return;
  if (overflowed(overflow)) return;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "MultiTensorAdamW does not implement amsgrad");
    Active a = active_parameters(group);
    if (a.params.empty()) continue;
    if (o.weight_decay() != 0) torch::_foreach_mul_(a.params, 1.0 - o.lr() * o.weight_decay());
    std::map<int64_t, Cohort> cohorts =
        adamw_cohorts(*this, a, [](const torch::Tensor& t, const torch::Tensor&) { return t; });
    const double beta1 = std::get<0>(o.betas());
    const double beta2 = std::get<1>(o.betas());
    for (auto& [step, c] : cohorts) {
      const double correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      torch::_foreach_mul_(c.exp_avg, beta1);
      torch::_foreach_add_(c.exp_avg, c.grads, 1 - beta1);
      torch::_foreach_mul_(c.exp_avg_sq, beta2);
      torch::_foreach_addcmul_(c.exp_avg_sq, c.grads, c.grads, 1 - beta2);
      std::vector<torch::Tensor> denom = torch::_foreach_sqrt(c.exp_avg_sq);
      torch::_foreach_div_(denom, std::sqrt(correction2));
      torch::_foreach_add_(denom, o.eps());
      torch::_foreach_addcdiv_(c.params, c.exp_avg, denom, -o.lr() / correction1);
    }
  }
}

}  // namespace myriad

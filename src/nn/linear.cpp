#include "memtrain/nn/linear.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/nn/conv2d.h"
#include "memtrain/nn/dropout.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"

#include <cmath>

namespace memtrain::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, DType dtype, double init_std)
    : in_features_(in_features), out_features_(out_features) {
  MT_CHECK(in_features > 0 && out_features > 0, "nn::Linear", "features must be positive, got in {} out {}",
           in_features, out_features);
  Tensor w = new_parameter({out_features, in_features}, dtype);
  init_normal_(w, init_std);
  weight_ = register_parameter("weight", w);
  if (bias) bias_ = register_parameter("bias", new_parameter({out_features}, dtype).zero_());
}

ops::Nf4Weight Linear::nf4_weight() const {
  MT_CHECK(weight_is_nf4(), "nn::Linear::nf4_weight", "the layer's weight is not stored in NF4");
  ops::Nf4Weight q;
  q.codes = weight_;
  q.absmax_codes = nf4_absmax_;
  q.absmax_scales = nf4_scales_;
  q.absmax_mean = nf4_offset_.item<float>();  // meta reads 0
  q.shape = {out_features_, in_features_};
  return q;
}

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = weight_is_nf4() ? ops::nf4_linear(x, nf4_weight(), bias_.defined() ? bias_.to(x.dtype()) : bias_)
                             : ops::linear(x, weight_, bias_);
  if (!has_lora() || lora_merged()) return y;
  const Tensor update = lora_b_->forward(lora_a_->forward(lora_dropout_->forward(x)));
  return y + ops::mul(update, lora_.scaling);
}

namespace {

// A frozen copy of `t` in `dtype` (the same tensor when it is already that), without gradient.
Tensor frozen(const Tensor& t, DType dtype) {
  Tensor out = t.dtype() == dtype ? t : t.detach().to(dtype);
  out.set_requires_grad(false);
  out.set_grad(Tensor());
  return out;
}

}  // namespace

void Linear::add_lora(const LoraSettings& settings, DType base_dtype) {
  const char* where = "nn::Linear::add_lora";
  MT_CHECK(!has_lora(), where, "the layer [{}, {}] has a LoRA adapter already", out_features(), in_features());
  MT_CHECK(settings.rank > 0, where, "rank must be positive, got {}", settings.rank);
  MT_CHECK(std::isfinite(settings.scaling), where, "scaling must be finite, got {}", settings.scaling);
  MT_CHECK(settings.dropout >= 0.0 && settings.dropout < 1.0, where, "dropout must be in [0, 1), got {}",
           settings.dropout);
  MT_CHECK(is_floating(base_dtype), where, "the frozen weight's dtype must be floating, got {}",
           dtype_name(base_dtype));
  const DType dtype = weight_.dtype();
  const Device device = weight_.device();
  // Made where the weight lives, as the layer's own parameters were.
  ParameterDeviceGuard on_device(device);
  auto a = std::make_shared<Linear>(in_features(), settings.rank, false, dtype);
  auto b = std::make_shared<Linear>(settings.rank, out_features(), false, dtype);
  {
    autograd::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features()));
    Tensor wa = a->weight_;
    init_uniform_(wa, -bound, bound);
    b->weight_.zero_();
  }
  lora_ = settings;
  lora_dropout_ = register_module("lora_dropout", std::make_shared<Dropout>(settings.dropout));
  lora_a_ = register_module("lora_A", a);
  lora_b_ = register_module("lora_B", b);
  if (settings.quantize_nf4) {
    const ops::Nf4Weight q = ops::nf4_quantize(weight_.detach());
    (void)remove_parameter("weight");
    weight_ = register_buffer("weight", q.codes);
    nf4_absmax_ = register_buffer("weight.absmax", q.absmax_codes);
    nf4_scales_ = register_buffer("weight.nested_absmax", q.absmax_scales);
    CategoryGuard category(MemoryCategory::parameters);
    nf4_offset_ = register_buffer("weight.nested_offset", full({1}, q.absmax_mean, DType::f32, device));
  } else {
    weight_ = replace_parameter("weight", frozen(weight_, base_dtype));
    weight_.set_requires_grad(false);
  }
  if (bias_.defined()) {
    bias_ = replace_parameter("bias", frozen(bias_, base_dtype));
    bias_.set_requires_grad(false);
  }
}

void Linear::merge_lora() {
  const char* where = "nn::Linear::merge_lora";
  MT_CHECK(has_lora(), where, "the layer [{}, {}] has no LoRA adapter", out_features(), in_features());
  MT_CHECK(!lora_merged(), where, "the adapter is merged already");
  MT_CHECK(!weight_is_nf4(), where, "the weight is stored in NF4; the merged sum would not be (dequantise it first)");
  autograd::NoGradGuard no_grad;
  const Tensor delta = ops::matmul(lora_b_->weight_.detach().to(DType::f32), lora_a_->weight_.detach().to(DType::f32));
  const Tensor merged = weight_.detach().to(DType::f32) + ops::mul(delta, lora_.scaling);
  {
    CategoryGuard category(MemoryCategory::parameters);
    unmerged_weight_ = weight_.detach().clone();
  }
  weight_.copy_(merged);
}

void Linear::unmerge_lora() {
  const char* where = "nn::Linear::unmerge_lora";
  MT_CHECK(has_lora(), where, "the layer [{}, {}] has no LoRA adapter", out_features(), in_features());
  MT_CHECK(lora_merged(), where, "the adapter is not merged");
  weight_.copy_(unmerged_weight_);
  unmerged_weight_ = Tensor();
}

void init_torch_default_(const Linear& lin) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(lin.in_features()));
  Tensor w = lin.weight().detach();  // views of the parameters' storage
  init_uniform_(w, -bound, bound);
  if (lin.bias().defined()) {
    Tensor b = lin.bias().detach();
    init_uniform_(b, -bound, bound);
  }
}

}  // namespace memtrain::nn

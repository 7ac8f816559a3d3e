// The Trainer as one stage of a pipeline (memtrain/train/pipeline.h): a step's micro-batches through the
// stages, a val batch's forward, and the tied weight's update.
#include "memtrain/amp/autocast.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/nn.h"
#include "memtrain/optim/galore.h"
#include "memtrain/core/rng.h"
#include "memtrain/train/pipeline.h"
#include "memtrain/train/trainer.h"
#include "train/gradient_tree.h"
#include "train/pipeline_stage.h"

#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <optional>

namespace memtrain::train {

void Trainer::attach_pipeline(std::shared_ptr<PipelineLink> link, std::shared_ptr<const nn::GPT> model) {
  const char* where = "Trainer::attach_pipeline";
  MT_CHECK(link != nullptr && model != nullptr, where, "the link or the stage model is null");
  MT_CHECK(step_ == 0, where, "attach before the first step (this trainer has run {})", step_);
  MT_CHECK(!user_optimizer_, where, "an optimizer built by the caller: the stages need the config's optimizer");
  MT_CHECK(model_.get() == model.get(), where, "the trainer was not built over this stage model");
  const nn::GPTStage& s = model->stage();
  MT_CHECK(config_.pipeline_stages == link->stages() && s.count == link->stages() && s.index == link->stage(), where,
           "config.pipeline_stages {}, the model's stage {} of {} and the link's stage {} of {} must agree",
           config_.pipeline_stages, s.index, s.count, link->stage(), link->stages());
  auto p = std::make_shared<detail::PipelineStage>();
  p->link = std::move(link);
  p->model = model;
  p->stage = s.index;
  p->stages = s.count;
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, t] : model->named_parameters()) {
    names[t.impl_ptr().get()] = name;
    if (name == "wte.weight") p->tied = t;  // on the first and the last stage
  }
  // The whole model's parameter order, from a copy on meta (no memory; the RNG stream left as it was).
  std::map<std::string, std::size_t> global;
  {
    RngStateGuard rng;
    nn::ParameterDeviceGuard on_meta(Device::meta());
    const nn::GPT whole(model->config(), model->parameters().front().dtype());
    const nn::NamedTensors named = whole.named_parameters();
    std::map<std::string, std::int64_t> numel;
    for (const auto& [name, t] : named) numel[name] = t.numel();
    for (const std::string& name : detail::trained_order(config_, named)) {
      global[name] = p->global_numels.size();
      p->global_numels.push_back(numel.at(name));
    }
  }
  for (const Tensor& t : trained_params()) p->global_index.push_back(global.at(names.at(t.impl_ptr().get())));
  // GaLore keys each weight's random projections by its place in the model: the whole model's, here.
  if (auto* galore = dynamic_cast<optim::GaLore*>(optimizer_.get())) galore->key_streams(p->global_index);
  // Dropout: each stage draws its masks from its own part of the stream, so no two stages' blocks share masks
  // (the bits then differ from one rank's, whose stream runs through every block in turn).
  if (p->stage > 0) {
    RngState rng = get_rng_state();
    rng.offset += static_cast<std::uint64_t>(p->stage) << 40;
    set_rng_state(rng);
  }
  pipeline_ = std::move(p);
}

std::vector<double> Trainer::pipeline_micro_batches(std::vector<data::Batch>& batches, std::int64_t total,
                                                    detail::GradientTree& tree) {
  const char* where = "Trainer::train_step";
  detail::PipelineStage& p = *pipeline_;
  const auto m = static_cast<std::int64_t>(batches.size());
  const auto seed_of = [&](const data::Batch& b) {
    const double weight = static_cast<double>(b.targets_count) / static_cast<double>(total);
    return scaler_ ? weight * scaler_->scale() : weight;
  };
  const auto started = std::chrono::steady_clock::now();
  // A receive waits for the other stages: the time it blocks is this stage's idle time.
  const auto receive = [&](int peer, int tag) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor t = p.link->receive(peer, tag);
    p.idle_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return t;
  };
  struct InFlight {
    Tensor input;       // the received activation, a leaf (undefined on the first stage)
    Tensor output;      // what was sent on, or the loss
    Tensor token_rows;  // first stage: the lookup's rows, a leaf
  };
  std::map<std::int64_t, InFlight> flight;
  std::vector<double> weighted(batches.size(), 0.0);

  // The last stage's wte: a micro-batch's head gradient joins wte's tree once the first stage's lookup gradient
  // for it has been scattered in, as the embedding's backward does on one rank.
  const bool tied_here = p.stages > 1 && p.last() && p.tied.defined();
  std::optional<detail::GradientTree> tied_tree;
  if (tied_here) tied_tree.emplace(std::vector<Tensor>{p.tied});
  std::deque<Tensor> head_grads;  // of micro-batches tied_next, tied_next + 1, ...
  std::int64_t tied_next = 0;
  const auto join_tied = [&](std::int64_t end) {
    for (; tied_next < end; ++tied_next) {
      const data::Batch& b = batches[static_cast<std::size_t>(tied_next)];
      if (b.targets_count > 0) {
        CategoryGuard category(MemoryCategory::gradients);
        Tensor head = std::move(head_grads.front());
        head_grads.pop_front();
        const Tensor rows = receive(0, detail::kTagTokenRowsGrad);
        if (!head.defined()) head = zeros(p.tied.shape(), p.tied.dtype(), p.tied.device());
        ops::embedding_scatter_add_(head, rows.to(head.dtype()), b.inputs);
        p.tied.set_grad(head);
      }
      tied_tree->push_leaf();
    }
  };

  for (const PipelineAction& a : pipeline_order(config_.pipeline_schedule, p.stage, p.stages, m)) {
    p.link->reap_sends();
    const std::int64_t i = a.micro_batch;
    const data::Batch& batch = batches[static_cast<std::size_t>(i)];
    if (batch.targets_count == 0) {  // every stage skips it alike; the leaf keeps the tree's shape
      if (!a.forward) tree.push_leaf();
      continue;
    }
    if (a.forward) {
      mark(fmt::format("forward {}/{}", i + 1, m));
      InFlight f;
      if (!p.first()) {
        CategoryGuard category(MemoryCategory::activations);
        f.input = receive(p.stage - 1, detail::kTagActivation);
        f.input.set_requires_grad(true);
      }
      {
        autograd::EnableGradGuard grad_on;
        CategoryGuard category(MemoryCategory::activations);
        amp::Autocast autocast(autocast_mode());
        std::optional<ops::LossGradientSeed> declared;
        if (p.last() && config_.head_gradients_in_forward) declared.emplace(seed_of(batch));
        std::optional<ops::HeadGemmsInComputeDtype> narrow_head;
        if (config_.head_gemms_in_compute_dtype) narrow_head.emplace();
        nn::GPT::StageOutput out = p.model->forward_stage(batch.inputs, f.input, batch.targets);
        f.output = std::move(out.output);
        f.token_rows = std::move(out.token_rows);
      }
      if (p.last()) {
        MT_CHECK(f.output.numel() == 1 && f.output.requires_grad(), where,
                 "the last stage's loss of micro-batch {} is not a one-element tensor that requires grad", i);
        weighted[static_cast<std::size_t>(i)] =
            f.output.item() * static_cast<double>(batch.targets_count) / static_cast<double>(total);
      } else {
        p.link->send(f.output.detach(), p.stage + 1, detail::kTagActivation);
      }
      flight.emplace(i, std::move(f));
      continue;
    }
    mark(fmt::format("backward {}/{}", i + 1, m));
    InFlight f = std::move(flight.at(i));
    flight.erase(i);
    {
      Tensor grad;
      {
        CategoryGuard category(MemoryCategory::gradients);
        grad = p.last() ? full(f.output.shape(), seed_of(batch), f.output.dtype(), f.output.device())
                        : receive(p.stage + 1, detail::kTagActivationGrad);
      }
      autograd::backward({f.output}, {grad});
    }
    if (!p.first()) p.link->send(f.input.grad(), p.stage - 1, detail::kTagActivationGrad);
    if (p.first() && p.stages > 1) p.link->send(f.token_rows.grad(), p.stages - 1, detail::kTagTokenRowsGrad);
    if (tied_here) {
      head_grads.push_back(p.tied.grad());
      p.tied.set_grad(Tensor());
    }
    tree.push_leaf();
    // The first stage runs micro-batch i - (P - 1)'s backward at about this time: joining it now keeps at most
    // P head gradients waiting, without the wait that joining i itself would cost.
    if (tied_here) join_tied(i + 1 - (p.stages - 1));
  }
  if (tied_here) {
    join_tied(m);
    tied_tree->finish();
  }
  p.link->flush_sends();
  p.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Only the last stage has the losses.
  const std::vector<double> all = p.link->gather_f64(weighted);
  return std::vector<double>(all.end() - m, all.end());
}

double Trainer::pipeline_eval_loss(const data::Batch& batch) {
  detail::PipelineStage& p = *pipeline_;
  Tensor input;
  if (!p.first()) input = p.link->receive(p.stage - 1, detail::kTagEvalActivation);
  const nn::GPT::StageOutput out = p.model->forward_stage(batch.inputs, input, batch.targets);
  if (p.last()) return out.output.item();
  p.link->send(out.output, p.stage + 1, detail::kTagEvalActivation);
  p.link->flush_sends();
  return std::numeric_limits<double>::quiet_NaN();
}

void Trainer::pipeline_share_tied() {
  detail::PipelineStage& p = *pipeline_;
  if (p.stages == 1 || !p.tied.defined()) return;
  if (p.last()) {
    p.link->send(p.tied, 0, detail::kTagTiedWeight);
    p.link->flush_sends();  // the optimizer must not write wte until its bytes have left
  } else {
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor fresh = p.link->receive(p.stages - 1, detail::kTagTiedWeight);
    MT_CHECK(fresh.dtype() == p.tied.dtype() && fresh.shape() == p.tied.shape(), "Trainer::train_step",
             "the last stage sent wte as {} {}, this stage holds {} {}", dtype_name(fresh.dtype()),
             shape_str(fresh.shape()), dtype_name(p.tied.dtype()), shape_str(p.tied.shape()));
    autograd::NoGradGuard no_grad;
    Tensor(p.tied).copy_(fresh);
  }
}

}  // namespace memtrain::train

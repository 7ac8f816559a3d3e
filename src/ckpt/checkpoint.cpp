// Checkpointed regions: the forward's save hooks, the placeholders and the re-run (see checkpoint.h).
#include "memtrain/ckpt/checkpoint.h"

#include "memtrain/amp/autocast.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/dispatch_modes.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace memtrain::ckpt {
namespace {

constexpr const char* kOp = "ckpt::checkpoint";

std::atomic<std::int64_t> g_regions{0};
std::atomic<std::int64_t> g_recomputes{0};
std::atomic<double> g_recomputed_flops{0};
thread_local int t_rerun_depth = 0;  // re-runs in progress on this thread (nested regions re-run inside)

// Thrown by the re-run's save hook once the last placeholder is filled, so the rest of fn is skipped.
struct StopRerun {};

// Whether some entry of a keep list ("op", "op@label", "@label": op_label.h) covers `op` under `label`.
bool covers(const std::vector<std::string>& entries, std::string_view op, std::string_view label) {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const std::string& e) { return keep_entry_matches(e, op, label); });
}

// "linear@mlp.fc", or "linear" without a label: how errors name an op.
std::string op_str(std::string_view op, std::string_view label) {
  return label.empty() ? std::string(op) : fmt::format("{}@{}", op, label);
}

// Distinct storages seen during one forward, with their sizes. A weak reference tells a storage apart from a
// later one that reuses a freed address.
class StorageSet {
 public:
  void add(const std::shared_ptr<Storage>& s) {
    if (!s) return;
    auto [it, fresh] = index_.try_emplace(s.get(), entries_.size());
    if (!fresh && !entries_[it->second].ref.expired()) return;
    if (!fresh) {
      it->second = entries_.size();
    }
    entries_.push_back({s, s->nbytes(), s.get()});
  }
  bool contains(const Storage* s) const {
    auto it = index_.find(s);
    return it != index_.end() && !entries_[it->second].ref.expired();
  }
  // Bytes of the storages that are in neither `a` nor `b` (either may be null).
  std::size_t bytes_outside(const StorageSet* a, const StorageSet* b) const {
    std::size_t total = 0;
    for (const Entry& e : entries_) {
      const bool in_a = a && a->holds(e), in_b = b && b->holds(e);
      if (!in_a && !in_b) total += e.nbytes;
    }
    return total;
  }
  std::size_t bytes() const { return bytes_outside(nullptr, nullptr); }

 private:
  struct Entry {
    std::weak_ptr<Storage> ref;
    std::size_t nbytes;
    const Storage* address;
  };
  // Whether `e` (an entry of another set) is one of ours: same address and the same storage object.
  bool holds(const Entry& e) const {
    auto it = index_.find(e.address);
    if (it == index_.end()) return false;
    const Entry& mine = entries_[it->second];
    return !mine.ref.owner_before(e.ref) && !e.ref.owner_before(mine.ref);
  }
  std::unordered_map<const Storage*, std::size_t> index_;
  std::vector<Entry> entries_;
};

struct KeptOutputs {
  std::string op;               // op_str(op, label) of the op that produced them
  std::vector<Tensor> tensors;  // detached; empty once released (nothing saved them: the re-run recomputes)
};

// One expensive op's outputs in the forward, for the profile and for releasing kept outputs nobody saved.
struct ExpensiveOp {
  std::vector<std::weak_ptr<Storage>> outputs;
  std::size_t nbytes = 0;
  double flops = 0;
  bool saved = false;     // some op inside the region saved one of the outputs
  std::ptrdiff_t kept = -1;  // its entry in Frame::kept, if kept
  std::size_t saves_before = 0;  // tensors the region had saved when the op started
};

// Everything a region needs after its forward: how to re-run it and where the re-run's saves go.
struct Frame : std::enable_shared_from_this<Frame> {
  RegionFn fn;
  std::vector<std::string> keep_ops;
  std::vector<autograd::SavedTensor> inputs;  // saved through the enclosing hooks
  std::vector<bool> input_requires_grad;
  RngState rng;
  amp::AutocastMode autocast;  // the forward's amp::Autocast mode, restored for the re-run

  // One entry per SavedTensor created in the forward, in order.
  struct Slot {
    bool dropped = false;
    bool alive = true;  // its handle still exists (some node may unpack it)
    Shape shape;        // dropped ones: what the re-run must reproduce
    DType dtype = DType::f32;
    Tensor refilled;    // dropped ones, after a re-run
  };
  std::vector<Slot> slots;
  std::vector<KeptOutputs> kept;  // expensive ops' outputs, in forward order

  // Forward-only bookkeeping.
  std::unordered_set<const Storage*> input_storages;
  std::unordered_set<const Storage*> kept_storages;
  StorageSet saved, expensive, input_set, dropped;
  std::vector<ExpensiveOp> expensive_op_list;
  std::unordered_map<const Storage*, std::size_t> expensive_op_of;  // output storage -> expensive_op_list index
  // Index of the last save that full drops (anything but parameters and inputs) and of the last that selective
  // drops too (not an expensive op's output): a re-run in that mode stops there.
  std::ptrdiff_t last_full_drop = -1, last_selective_drop = -1;
  RegionProfile profile;

  // Re-run state.
  bool rerunning = false;
  std::size_t rerun_cursor = 0;   // next slot a re-run save fills
  std::size_t replay_cursor = 0;  // next entry of `kept`
  std::int64_t unfilled = 0;      // placeholders still waiting during a re-run

  std::vector<std::string> profile_ops;
  const std::vector<std::string>& expensive_ops() const {
    if (!profile_ops.empty()) return profile_ops;
    return keep_ops.empty() ? default_keep_ops() : keep_ops;
  }
  void rerun();
};

// What SavedTensorHooks::pack returns: either the tensor itself or a slot of the frame.
struct Handle {
  Tensor kept;
  std::shared_ptr<Frame> frame;
  std::size_t slot = 0;
  ~Handle() {
    if (!frame) return;
    Frame::Slot& s = frame->slots[slot];
    s.alive = false;
    s.refilled = Tensor();
  }
};

// A region's forward or re-run: the saved-tensor hooks its ops' saves go through, and the RecomputeMode
// (ops/dispatch_modes.h) its expensive ops hand their forwards to. Both are installed for the same scope.
class RegionHooks final : public autograd::SavedTensorHooks, public ops::RecomputeMode {
 public:
  RegionHooks(std::shared_ptr<Frame> frame, bool rerun) : frame_(std::move(frame)), rerun_(rerun) {}
  std::shared_ptr<void> pack(const Tensor& tensor) override { return rerun_ ? pack_rerun(tensor) : pack_forward(tensor); }
  Tensor unpack(const std::shared_ptr<void>& handle) override;
  std::vector<Tensor> compute_or_replay(std::string_view op, double flops,
                                        const std::function<std::vector<Tensor>()>& compute) override;

 private:
  std::shared_ptr<void> pack_forward(const Tensor& tensor);
  std::shared_ptr<void> pack_rerun(const Tensor& tensor);
  std::shared_ptr<Frame> frame_;
  bool rerun_;
};

// Installs `hooks` as this thread's saved-tensor hooks and RecomputeMode for the scope.
class RegionScope {
 public:
  explicit RegionScope(const std::shared_ptr<RegionHooks>& hooks) : saves_(hooks), recompute_(hooks.get()) {}

 private:
  autograd::SavedTensorHooksGuard saves_;
  ops::RecomputeModeGuard recompute_;
};

std::shared_ptr<void> RegionHooks::pack_forward(const Tensor& tensor) {
  Frame& f = *frame_;
  const std::size_t index = f.slots.size();
  Frame::Slot& slot = f.slots.emplace_back();
  ++f.profile.saved_tensors;
  const Storage* storage = tensor.storage().get();
  const bool parameter = tensor.is_leaf() && tensor.requires_grad();
  if (!parameter && !f.input_storages.count(storage)) {
    f.saved.add(tensor.storage());
    f.last_full_drop = static_cast<std::ptrdiff_t>(index);
    if (!f.expensive.contains(storage)) f.last_selective_drop = static_cast<std::ptrdiff_t>(index);
  }
  if (auto it = f.expensive_op_of.find(storage); it != f.expensive_op_of.end()) {
    ExpensiveOp& op = f.expensive_op_list[it->second];
    for (const auto& w : op.outputs) op.saved |= w.lock().get() == storage;  // the address, not a reused one
  }
  auto handle = std::make_shared<Handle>();
  if (parameter || f.input_storages.count(storage) || f.kept_storages.count(storage)) {
    handle->kept = tensor.detach();
    return handle;
  }
  slot.dropped = true;
  f.dropped.add(tensor.storage());
  slot.shape = tensor.shape();
  slot.dtype = tensor.dtype();
  ++f.profile.dropped_tensors;
  handle->frame = frame_;
  handle->slot = index;
  return handle;
}

std::shared_ptr<void> RegionHooks::pack_rerun(const Tensor& tensor) {
  Frame& f = *frame_;
  MT_CHECK(f.rerun_cursor < f.slots.size(), kOp,
           "the re-run of a region saved more tensors than its forward ({}): the region's function must run the same "
           "ops in the same order every time",
           f.slots.size());
  Frame::Slot& slot = f.slots[f.rerun_cursor++];
  if (slot.dropped && slot.alive && !slot.refilled.defined()) {
    MT_CHECK(slot.shape == tensor.shape() && slot.dtype == tensor.dtype(), kOp,
             "the re-run of a region saved a {} {} tensor where its forward saved a {} {} (saved tensor {}): the "
             "region's function must run the same ops in the same order every time",
             dtype_name(tensor.dtype()), shape_str(tensor.shape()), dtype_name(slot.dtype), shape_str(slot.shape),
             f.rerun_cursor - 1);
    slot.refilled = tensor.detach();
    if (--f.unfilled == 0) throw StopRerun{};
  }
  return nullptr;  // the re-run's graph is thrown away; nothing unpacks its saves
}

Tensor RegionHooks::unpack(const std::shared_ptr<void>& handle) {
  const auto& h = *static_cast<const Handle*>(handle.get());
  if (!h.frame) return h.kept;
  Frame::Slot& slot = h.frame->slots[h.slot];
  if (!slot.refilled.defined()) h.frame->rerun();
  MT_CHECK(slot.refilled.defined(), kOp, "internal error: the re-run did not refill saved tensor {}", h.slot);
  return slot.refilled;
}

void Frame::rerun() {
  MT_CHECK(!rerunning, kOp,
           "a saved tensor of a region was needed while that region was being re-run (backward inside the region's "
           "function?)");
  unfilled = 0;
  for (const Slot& s : slots) unfilled += s.dropped && s.alive && !s.refilled.defined();
  if (unfilled == 0) return;

  std::vector<Tensor> args;
  args.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].unpack();  // may re-run an enclosing region first
    if (t.defined()) {
      t = t.detach();
      t.set_requires_grad(input_requires_grad[i]);
    }
    args.push_back(std::move(t));
  }
  RngStateGuard rng_guard;
  set_rng_state(rng);
  amp::Autocast autocast_guard(autocast);
  autograd::EnableGradGuard grad_on;
  CategoryGuard category(MemoryCategory::activations);
  rerunning = true;
  ++t_rerun_depth;
  rerun_cursor = 0;
  replay_cursor = 0;
  try {
    const RegionScope scope(std::make_shared<RegionHooks>(shared_from_this(), true));
    fn(args);
  } catch (const StopRerun&) {
  } catch (...) {
    rerunning = false;
    --t_rerun_depth;
    throw;
  }
  rerunning = false;
  --t_rerun_depth;
  g_recomputes.fetch_add(1, std::memory_order_relaxed);
  MT_CHECK(unfilled == 0, kOp,
           "the re-run of a region saved {} tensors where its forward saved {}: the region's function must run the "
           "same ops in the same order every time",
           rerun_cursor, slots.size());
}

std::vector<Tensor> RegionHooks::compute_or_replay(std::string_view op, double flops,
                                                   const std::function<std::vector<Tensor>()>& compute) {
  // Only while this region's hooks take the saves (as when the ops found the region through them): other hooks
  // installed inside the region take the saves of their scope, and the region then neither notes nor replays.
  if (autograd::current_saved_tensor_hooks().get() != this) return compute();
  Frame& f = *frame_;
  const std::string_view label = current_op_label();
  const bool keep = covers(f.keep_ops, op, label);
  if (rerun_) {
    const auto recompute = [&] {
      g_recomputed_flops.fetch_add(flops, std::memory_order_relaxed);
      return compute();
    };
    if (!keep) return recompute();
    const std::string name = op_str(op, label);
    MT_CHECK(f.replay_cursor < f.kept.size() && f.kept[f.replay_cursor].op == name, kOp,
             "the re-run of a region reached {} where its forward kept {}: the region's function must run the same "
             "ops in the same order every time",
             name, f.replay_cursor < f.kept.size() ? f.kept[f.replay_cursor].op : std::string("nothing more"));
    const KeptOutputs& kept = f.kept[f.replay_cursor++];
    if (kept.tensors.empty()) return recompute();  // released after the forward: nothing saved it
    std::vector<Tensor> out;
    for (const Tensor& t : kept.tensors) out.push_back(t.detach());
    return out;
  }
  const std::size_t saves_before = f.slots.size();
  std::vector<Tensor> out = compute();
  if (covers(f.expensive_ops(), op, label)) {
    f.profile.expensive_flops += flops;
    ExpensiveOp& e = f.expensive_op_list.emplace_back();
    e.flops = flops;
    e.saves_before = saves_before;
    if (keep) e.kept = static_cast<std::ptrdiff_t>(f.kept.size());
    for (const Tensor& t : out) {
      if (!t.defined()) continue;
      f.expensive.add(t.storage());
      e.outputs.push_back(t.storage());
      e.nbytes += t.storage()->nbytes();
      f.expensive_op_of[t.storage().get()] = f.expensive_op_list.size() - 1;
    }
  }
  if (keep) {
    KeptOutputs& k = f.kept.emplace_back();
    k.op = op_str(op, label);
    for (const Tensor& t : out) {
      k.tensors.push_back(t.defined() ? t.detach() : Tensor());
      if (t.defined()) f.kept_storages.insert(t.storage().get());
    }
  }
  return out;
}

}  // namespace

const std::vector<std::string>& default_keep_ops() {
  static const std::vector<std::string> ops = {"matmul", "linear", "scaled_dot_product_attention", "conv2d"};
  return ops;
}

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs, const RegionOptions& options,
                               RegionProfile* profile) {
  MT_CHECK(static_cast<bool>(fn), kOp, "the region's function is empty");
  for (const std::string& e : options.keep_ops) check_keep_entry(e, kOp);
  for (const std::string& e : options.profile_ops) check_keep_entry(e, kOp);
  if (!autograd::grad_enabled()) return fn(inputs);  // nothing is saved without grad mode

  auto frame = std::make_shared<Frame>();
  frame->fn = fn;
  frame->keep_ops = options.keep_ops;
  frame->profile_ops = options.profile_ops;
  frame->rng = get_rng_state();
  frame->autocast = amp::autocast_mode();
  for (const Tensor& t : inputs) {
    frame->inputs.emplace_back(t);  // through the enclosing hooks: an outer region may drop it
    frame->input_requires_grad.push_back(t.defined() && t.requires_grad());
    if (t.defined()) {
      frame->input_storages.insert(t.storage().get());
      frame->input_set.add(t.storage());
    }
  }
  g_regions.fetch_add(1, std::memory_order_relaxed);

  std::vector<Tensor> outputs;
  {
    const RegionScope scope(std::make_shared<RegionHooks>(frame, false));
    outputs = fn(inputs);
  }

  Frame& f = *frame;
  f.profile.input_bytes = f.input_set.bytes();
  f.profile.saved_bytes = f.saved.bytes();
  f.profile.cheap_saved_bytes = f.saved.bytes_outside(&f.input_set, &f.expensive);
  // Outputs of expensive ops that nothing saved are not needed by backward: a selective region lets them go
  // (the re-run recomputes them if a later op needs them) instead of holding bytes `none` would not hold.
  for (const ExpensiveOp& op : f.expensive_op_list) {
    const auto started = static_cast<std::ptrdiff_t>(op.saves_before);
    if (started <= f.last_full_drop) f.profile.full_rerun_flops += op.flops;
    if (op.saved) {
      f.profile.expensive_bytes += op.nbytes;
    } else {
      if (started <= f.last_selective_drop) f.profile.unsaved_expensive_flops += op.flops;
      if (op.kept >= 0) f.kept[static_cast<std::size_t>(op.kept)].tensors.clear();
    }
  }
  f.profile.dropped_bytes = f.dropped.bytes();
  if (profile) *profile = f.profile;
  // The forward-only sets hold raw addresses and weak references; the frame lives on with the graph.
  f.input_storages.clear();
  f.kept_storages.clear();
  f.saved = f.expensive = f.input_set = f.dropped = StorageSet();
  f.expensive_op_list.clear();
  f.expensive_op_of.clear();
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const RegionOptions& options,
                  RegionProfile* profile) {
  MT_CHECK(static_cast<bool>(fn), kOp, "the region's function is empty");
  const RegionFn wrapped = [fn](const std::vector<Tensor>& args) { return std::vector<Tensor>{fn(args[0])}; };
  return checkpoint(wrapped, {input}, options, profile)[0];
}

bool in_rerun() { return t_rerun_depth > 0; }

Counters counters() {
  return {g_regions.load(std::memory_order_relaxed), g_recomputes.load(std::memory_order_relaxed),
          g_recomputed_flops.load(std::memory_order_relaxed)};
}

namespace detail {

std::vector<Tensor> compute_or_replay(std::string_view op, double flops,
                                      const std::function<std::vector<Tensor>()>& compute) {
  return ops::detail::compute_or_replay(op, flops, compute);
}

}  // namespace detail
}  // namespace memtrain::ckpt

// Optimizer offload to files (core/file_arena.h, TrainerConfig::offload_optimizer): the arena's bytes and its
// refusals, every optimizer bit-identical to its in-memory twin with the process holding none of the state
// after a step (the kernel's own count of the mappings' resident pages), and the Trainer: the same losses and
// weights, the state outside the allocator's figures, a resume, start-up refusals, and the prediction.
#include "memtrain/core/file_arena.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/state_arena.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/optim/galore.h"
#include "memtrain/optim/optim.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "file_size_limit.h"
#include "temp_dir.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::Tensor;
using mt::test_support::error_of;
using mt::test_support::TempDir;

namespace {

// The resident bytes of the mapping that holds `ptr`, as the kernel counts them (/proc/self/smaps "Rss:").
std::size_t resident_bytes_of_mapping(const void* ptr) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find('-') != std::string::npos && (head >> std::hex >> begin >> dash >> end) && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = at >= begin && at < end;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stoull(line.substr(4)) * 1024;
  }
  ADD_FAILURE() << "no mapping holds " << ptr;
  return 0;
}

// An arena in shared anonymous memory (whose contents, like a file's, survive MADV_DONTNEED) that records, each
// time a slice is about to be stepped, how much of all its state the process holds then.
class RecordingArena final : public mt::StateArena {
 public:
  RecordingArena() : StateArena(mt::Device::cpu()) {}
  std::string where() const override { return "shared memory (test)"; }
  void release(const void* ptr, std::size_t nbytes) noexcept override {
    const auto [begin, length] = pages(ptr, nbytes);
    ::madvise(begin, length, MADV_DONTNEED);
  }
  // As FileArena does: the slice's pages mapped for writing at once, so that no read fault maps its neighbours
  // (the kernel's fault-around) behind the releases' backs.
  void prepare(void* ptr, std::size_t nbytes) noexcept override {
    ++prepared;
    std::size_t held = 0;
    for (const void* map : maps_) held += resident_bytes_of_mapping(map);
    most_held = std::max(most_held, held);
    const auto [begin, length] = pages(ptr, nbytes);
    ::madvise(begin, length, MADV_POPULATE_WRITE);
  }
  bool zero_filled() const override { return true; }

  std::int64_t prepared = 0;
  std::size_t most_held = 0;

 protected:
  void* take(std::size_t nbytes) override {
    void* p = ::mmap(nullptr, std::max<std::size_t>(nbytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    maps_.push_back(p);
    return p;
  }
  void give_back(void* ptr, std::size_t nbytes) noexcept override {
    ::munmap(ptr, std::max<std::size_t>(nbytes, 1));
    maps_.erase(std::find(maps_.begin(), maps_.end(), ptr));
  }

 private:
  static std::pair<void*, std::size_t> pages(const void* ptr, std::size_t nbytes) {
    const std::uintptr_t page = 4096;
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(ptr) & ~(page - 1);
    const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(ptr) + nbytes + page - 1) & ~(page - 1);
    return {reinterpret_cast<void*>(begin), end - begin};
  }
  std::vector<void*> maps_;
};

std::size_t resident_state_bytes(const mt::optim::Optimizer& opt) {
  std::size_t total = 0;
  for (const auto& [key, t] : opt.state_view())
    if (mt::in_state_arena(t)) total += resident_bytes_of_mapping(t.data_ptr());
  return total;
}

std::vector<float> values(const Tensor& t) {
  Tensor c = t.detach().to(mt::DType::f32).contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// Bytes of a state dict's tensors compared as raw bytes.
void expect_same_state(const mt::optim::StateDict& a, const mt::optim::StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, t] : a) {
    ASSERT_TRUE(b.count(key)) << key;
    const Tensor& u = b.at(key);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << key;
    EXPECT_EQ(0, std::memcmp(t.contiguous().data_ptr(), u.contiguous().data_ptr(), t.nbytes())) << key;
  }
}

}  // namespace

// ---- the arena -----------------------------------------------------------------------------------------

TEST(FileArena, RefusesAMissingOrNonDirectoryOrUnwritablePath) {
  TempDir dir;
  const std::string missing = dir.file("nowhere");
  EXPECT_NE(error_of([&] { mt::FileArena arena(missing); }).find("'" + missing + "' cannot be used"),
            std::string::npos);
  const std::string file = dir.file("a_file");
  std::ofstream(file) << "x";
  EXPECT_NE(error_of([&] { mt::FileArena arena(file); }).find("is not a directory"), std::string::npos);
  // Root may write anywhere a mode allows; /proc takes no files from anyone.
  EXPECT_NE(error_of([] { mt::FileArena arena("/proc"); }).find("cannot make a probe file in '/proc'"),
            std::string::npos);
  EXPECT_TRUE(dir.entries().size() == 1) << "the probe files are gone";
}

TEST(FileArena, NamesTheBytesItHasNoRoomFor) {
  TempDir dir;
  mt::FileArena arena(dir.path());
  arena.check_room(1 << 20, 1 << 20);
  mt::test_support::FileSizeLimit limit(1 << 20);
  ASSERT_TRUE(limit.ok());
  const std::string e = error_of([&] { arena.check_room(8 << 20, 8 << 20); });
  EXPECT_NE(e.find("offload: '" + dir.path() + "' has no room for the optimizer state of 8388608 bytes"),
            std::string::npos) << e;
  std::shared_ptr<mt::StateArena> shared = std::make_shared<mt::FileArena>(dir.path());
  mt::StateArenaGuard placed(shared);
  mt::CategoryGuard state(mt::MemoryCategory::optimizer_state);
  EXPECT_NE(error_of([] { (void)mt::zeros({4 << 20}); }).find("has no room for a state tensor of 16777216 bytes"),
            std::string::npos);
  EXPECT_EQ(shared->live_bytes(), 0u);
}

// Only optimizer state on the CPU goes to the arena, uncounted by the allocator; released pages keep their values
// and leave the process.
TEST(FileArena, HoldsOptimizerStateOutsideTheAllocatorAndReleasesItsPages) {
  TempDir dir;
  auto arena = std::make_shared<mt::FileArena>(dir.path());
  mt::Allocator& cpu = mt::Allocator::get(mt::Device::cpu());
  const std::size_t state_before = cpu.stats()[mt::MemoryCategory::optimizer_state].live_bytes;
  mt::StateArenaGuard placed(arena);
  Tensor other = mt::zeros({1000});  // another category: the allocator's
  EXPECT_FALSE(mt::in_state_arena(other));
  mt::CategoryGuard category(mt::MemoryCategory::optimizer_state);
  const std::int64_t n = 1 << 20;  // 4 MiB
  Tensor t = mt::Tensor::empty({n});
  ASSERT_TRUE(mt::in_state_arena(t));
  EXPECT_FALSE(mt::in_state_arena(mt::Tensor::empty({4}, mt::DType::f32, mt::Device::meta())));
  EXPECT_EQ(arena->live_bytes(), static_cast<std::size_t>(4 * n));
  EXPECT_EQ(cpu.stats()[mt::MemoryCategory::optimizer_state].live_bytes, state_before);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000) * 0.5f;
  EXPECT_GE(resident_bytes_of_mapping(p), static_cast<std::size_t>(4 * n));
  mt::release_state_pages(t.narrow(0, 0, n / 2));
  const std::size_t half = resident_bytes_of_mapping(p);
  EXPECT_LE(half, static_cast<std::size_t>(2 * n + 4096));
  EXPECT_GE(half, static_cast<std::size_t>(2 * n - 4096));
  mt::release_state_pages(t);
  EXPECT_EQ(resident_bytes_of_mapping(p), 0u);
  for (std::int64_t i = 0; i < n; i += 997) ASSERT_EQ(p[i], static_cast<float>(i % 1000) * 0.5f) << i;
  t = Tensor();
  EXPECT_EQ(arena->live_bytes(), 0u);
  EXPECT_EQ(arena->peak_bytes(), static_cast<std::size_t>(4 * n));
  EXPECT_TRUE(dir.entries().empty()) << "the files are unlinked as they are made";
}

// ---- every optimizer, in files and in memory -------------------------------------------------------------

namespace {

struct Twins {
  std::vector<Tensor> in_memory, in_files;
};

// Parameters large enough for 8-bit state and several slices, a bias, a matrix for GaLore and Adafactor.
Twins make_params() {
  mt::manual_seed(3);
  Twins t;
  for (const mt::Shape& s : std::vector<mt::Shape>{{96, 130}, {130}, {40, 64}}) {
    Tensor p = mt::randn(s);
    t.in_memory.push_back(p.clone());
    t.in_files.push_back(p.clone());
  }
  return t;
}

using MakeOptimizer = std::function<std::unique_ptr<mt::optim::Optimizer>(const std::vector<Tensor>&)>;

void expect_offload_bit_identical(const MakeOptimizer& make, const std::string& what) {
  SCOPED_TRACE(what);
  TempDir dir;
  Twins p = make_params();
  auto a = make(p.in_memory);
  auto b = make(p.in_files);
  const auto arena = std::make_shared<mt::FileArena>(dir.path());
  b->set_state_arena(arena);
  // Many slices per tensor, ending mid-block: 8-bit state is cut on its 256-element blocks.
  a->set_narrow_params({.slice_elements = 1000});
  b->set_narrow_params({.slice_elements = 1000});
  const mt::optim::Optimizer::StatePlan planned = b->planned_state();
  mt::manual_seed(11);
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < p.in_memory.size(); ++i) {
      const Tensor g = mt::randn(p.in_memory[i].shape());
      p.in_memory[i].set_grad(g.clone());
      p.in_files[i].set_grad(g.clone());
    }
    a->step();
    b->step();
    EXPECT_EQ(resident_state_bytes(*b), 0u) << "step " << step;
  }
  for (std::size_t i = 0; i < p.in_memory.size(); ++i) EXPECT_EQ(values(p.in_memory[i]), values(p.in_files[i]));
  EXPECT_EQ(a->state_bytes(), b->state_bytes());
  EXPECT_EQ(planned.bytes, b->state_bytes()) << "planned before the first step";
  std::size_t largest = 0;
  for (const auto& [key, t] : b->state_view())
    if (mt::in_state_arena(t)) largest = std::max(largest, t.nbytes());
  EXPECT_EQ(planned.largest_tensor_bytes, largest);
  EXPECT_EQ(arena->live_bytes(), b->state_bytes());
  expect_same_state(a->state_dict(), b->state_dict());
  // A load goes into the files too, and leaves nothing resident.
  auto c = make(p.in_files);
  c->set_state_arena(arena);
  c->load_state_dict(a->state_dict());
  EXPECT_EQ(resident_state_bytes(*c), 0u);
  expect_same_state(a->state_dict(), c->state_dict());
}

}  // namespace

TEST(OptimizerOffload, EveryOptimizerStepsBitIdenticallyAndHoldsNoStateResident) {
  using mt::optim::Spec;
  for (const Spec& spec : {Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), Spec::adamw8bit({.lr = 1e-2}),
                           Spec::lion({.lr = 1e-3}), Spec::lion8bit({.lr = 1e-3}), Spec::sgd({.momentum = 0.9}),
                           Spec::adafactor({.beta1 = 0.9})}) {
    expect_offload_bit_identical([spec](const std::vector<Tensor>& ps) { return spec.make(ps); }, spec.to_string());
  }
  mt::optim::GaLoreSpec galore;
  galore.rank = 8;
  galore.update_gap = 2;
  expect_offload_bit_identical(
      [galore](const std::vector<Tensor>& ps) {
        mt::optim::GaLoreGroups groups;
        groups.projected.push_back({.params = {ps[0], ps[2]}, .lr = 1e-2});
        groups.plain.push_back({.params = {ps[1]}, .lr = 1e-2});
        return std::make_unique<mt::optim::GaLore>(mt::optim::Spec::adamw8bit(), galore, std::move(groups));
      },
      "galore-adamw8bit");
}

// Within a step the process holds the state of about one slice: each is handed back before the next is mapped.
TEST(OptimizerOffload, AStepHoldsOneSliceOfStateAtATime) {
  for (const bool eight_bit : {false, true}) {
    SCOPED_TRACE(eight_bit ? "adamw8bit" : "adamw");
    mt::manual_seed(3);
    Tensor p = mt::randn({96, 1300});  // 124800 elements: 16 slices of 8192 (32 8-bit blocks each)
    p.set_grad(mt::randn({96, 1300}));
    auto opt = eight_bit ? mt::optim::Spec::adamw8bit().make({p}) : mt::optim::Spec::adamw().make({p});
    const auto arena = std::make_shared<RecordingArena>();
    opt->set_state_arena(arena);
    opt->set_narrow_params({.slice_elements = 8192});
    for (int step = 0; step < 2; ++step) opt->step();
    const auto state = opt->state_view();
    const auto tensors =
        std::count_if(state.begin(), state.end(), [](const auto& e) { return !e.first.ends_with(".step"); });
    EXPECT_EQ(arena->prepared, 2 * 16 * tensors) << "a prepare per slice of each state tensor";
    // Before a slice's state is mapped, the process holds at most the slice's other state tensors: the slices
    // before it were handed back (8 bytes an element for AdamW; 2, plus 8 per 256, for 8-bit), a page either side.
    const std::size_t slice_state = eight_bit ? 2 * 8192 + 8 * 32 : 8 * 8192;
    EXPECT_LE(arena->most_held, slice_state + static_cast<std::size_t>(tensors) * 2 * 4096);
    EXPECT_LT(arena->most_held, opt->state_bytes() / 4) << "far from the whole state";
  }
}

TEST(OptimizerOffload, ArenaIsChosenBeforeAnyState) {
  TempDir dir;
  Twins p = make_params();
  auto opt = mt::optim::Spec::adamw().make(p.in_memory);
  for (Tensor& t : p.in_memory) t.set_grad(mt::ones(t.shape()));
  opt->step();
  EXPECT_NE(error_of([&] { opt->set_state_arena(std::make_shared<mt::FileArena>(dir.path())); })
                .find("holds " + std::to_string(opt->state_bytes()) + " bytes of state already"),
            std::string::npos);
}

// ---- the Trainer ---------------------------------------------------------------------------------------

namespace {

mt::train::TrainerConfig offload_config(const std::string& checkpoint_dir) {
  mt::train::TrainerConfig c = mt::test_support::quiet_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  c.grad_clip = 0.5;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.max_steps = 6;
  c.checkpoint_dir = checkpoint_dir;
  return c;
}

mt::nn::GPTConfig small_gpt() {
  mt::nn::GPTConfig g = mt::nn::GPTConfig::preset("tiny");
  g.vocab_size = 64;
  g.block_size = 16;
  return g;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  mt::train::RunSummary summary;
};

RunResult train(const mt::train::TrainerConfig& c, std::int64_t steps, const std::string& resume_from = "",
          const std::string& save_to = "") {
  auto ds = std::make_shared<mt::test_support::TokenDataset>(16, 16, 64);
  mt::manual_seed(5);
  auto gpt = std::make_shared<mt::nn::GPT>(small_gpt());
  mt::train::Trainer t(c, gpt, mt::test_support::gpt_loss(gpt), ds);
  if (!resume_from.empty()) t.load_checkpoint(resume_from);
  RunResult run;
  while (t.step() < steps) run.losses.push_back(t.train_step().loss);
  if (!save_to.empty()) t.save_checkpoint(save_to);
  for (const auto& [name, p] : gpt->named_parameters()) run.weights.push_back(values(p));
  return run;
}

}  // namespace

// Every path a step takes state through: the elementwise slices, bf16 parameters with Kahan (their compensations),
// layer-wise 8-bit GaLore (stepped from the backward's hooks, outside step()), Adafactor (a coupled rule).
TEST(TrainerOffload, SameBitsAsInMemoryWithTheStateInFiles) {
  TempDir dir;
  struct Case {
    const char* name;
    mt::optim::Spec optimizer;
    mt::amp::Precision precision = mt::amp::Precision::fp32;
    mt::amp::ParamDtype params = mt::amp::ParamDtype::f32;
    std::int64_t galore_rank = 0;
    bool layerwise = false;
  };
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  for (const Case& k : std::vector<Case>{
           {"adamw", adamw},
           {"adamw, bf16 parameters with Kahan", adamw, mt::amp::Precision::bf16, mt::amp::ParamDtype::bf16_kahan},
           {"layer-wise 8-bit GaLore", mt::optim::Spec::adamw8bit({.lr = 3e-3}), mt::amp::Precision::fp32,
            mt::amp::ParamDtype::f32, 4, true},
           {"adafactor, bf16 parameters with Kahan", mt::optim::Spec::adafactor({.beta1 = 0.9}),
            mt::amp::Precision::bf16, mt::amp::ParamDtype::bf16_kahan}}) {
    SCOPED_TRACE(k.name);
    mt::train::TrainerConfig c = offload_config("");
    c.max_steps = 4;
    c.optimizer = k.optimizer;
    c.precision = k.precision;
    c.param_dtype = k.params;
    c.galore_rank = k.galore_rank;
    c.galore_update_gap = 2;
    c.layerwise_update = k.layerwise;
    const RunResult memory = train(c, 4);
    c.offload_optimizer = "file:" + dir.path();
    auto ds = std::make_shared<mt::test_support::TokenDataset>(16, 16, 64);
    mt::manual_seed(5);
    auto gpt = std::make_shared<mt::nn::GPT>(small_gpt());
    mt::train::Trainer t(c, gpt, mt::test_support::gpt_loss(gpt), ds);
    const mt::train::RunSummary s = t.fit();
    std::vector<double> losses;
    for (const auto& m : t.history()) losses.push_back(m.loss);
    EXPECT_EQ(losses, memory.losses);
    std::size_t i = 0;
    for (const auto& [name, p] : gpt->named_parameters()) EXPECT_EQ(values(p), memory.weights[i++]) << name;
    EXPECT_GT(s.optimizer_state_bytes, 0u);
    // The files' peak is the state's, plus under GaLore a basis being refreshed (the new one made before the old
    // one goes).
    if (k.galore_rank == 0) EXPECT_EQ(s.offloaded_state_bytes, s.optimizer_state_bytes);
    EXPECT_GE(s.offloaded_state_bytes, s.optimizer_state_bytes);
    EXPECT_EQ(s.peak_bytes_by_category.at("optimizer_state"), 0u) << "the allocator holds none of it";
    for (const auto& [key, state] : t.optimizer().state_view())
      EXPECT_TRUE(key.ends_with("step") || key.ends_with("rng") || key.ends_with("refresh_count") ||
                  mt::in_state_arena(state)) << key << " is not in the files";
    EXPECT_EQ(resident_state_bytes(t.optimizer()), 0u);
  }
}

TEST(TrainerOffload, ResumesFromItsCheckpointBitForBit) {
  TempDir ckpt, files;
  mt::train::TrainerConfig c = offload_config(ckpt.path());
  c.offload_optimizer = "file:" + files.path();
  const RunResult whole = train(c, 6);
  const std::string path = ckpt.file("ckpt.safetensors");
  const RunResult first = train(c, 3, "", path);
  const RunResult rest = train(c, 6, path);
  std::vector<double> losses = first.losses;
  losses.insert(losses.end(), rest.losses.begin(), rest.losses.end());
  EXPECT_EQ(losses, whole.losses);
  EXPECT_EQ(rest.weights, whole.weights);
  EXPECT_TRUE(files.entries().empty()) << "no state file outlives its run";
}

TEST(TrainerOffload, RefusesABadDirectoryAtStartUp) {
  TempDir dir;
  auto ds = std::make_shared<mt::test_support::TokenDataset>(16, 16, 64);
  auto gpt = std::make_shared<mt::nn::GPT>(small_gpt());
  mt::train::TrainerConfig c = offload_config("");
  c.offload_optimizer = "file:" + dir.file("missing");
  EXPECT_NE(error_of([&] { mt::train::Trainer t(c, gpt, mt::test_support::gpt_loss(gpt), ds); })
                .find("offload: directory '" + dir.file("missing") + "' cannot be used"),
            std::string::npos);
  // Too small: fit() names the bytes the state needs before its first step.
  c.offload_optimizer = "file:" + dir.path();
  const mt::optim::Optimizer::StatePlan plan =
      mt::train::Trainer(c, gpt, mt::test_support::gpt_loss(gpt), ds).optimizer().planned_state();
  ASSERT_LT(2 * plan.largest_tensor_bytes, plan.bytes) << "the state must be several files for this test";
  {
    // A filesystem that caps a file below the largest tensor cannot hold the state.
    mt::train::Trainer t(c, gpt, mt::test_support::gpt_loss(gpt), ds);
    mt::test_support::FileSizeLimit cap(plan.largest_tensor_bytes - 1);
    ASSERT_TRUE(cap.ok());
    const std::string e = error_of([&] { t.fit(); });
    EXPECT_NE(e.find(fmt::format("cannot hold the largest state tensor, {} bytes, in one file",
                                 plan.largest_tensor_bytes)), std::string::npos) << e;
    EXPECT_EQ(t.step(), 0);
  }
  {
    // One that caps a file above it holds the state, a file per tensor, although not in one file.
    mt::train::Trainer t(c, gpt, mt::test_support::gpt_loss(gpt), ds);
    mt::test_support::FileSizeLimit cap(plan.largest_tensor_bytes);
    ASSERT_TRUE(cap.ok());
    t.fit();
    EXPECT_GT(t.step(), 0);
    EXPECT_EQ(t.optimizer().state_bytes(), plan.bytes);
  }
}

TEST(FileArena, RefusesADirectoryInMemory) {
  // tmpfs keeps its files in RAM: the state would not leave the machine's memory.
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm here";
  const std::string e = error_of([] { mt::FileArena arena("/dev/shm"); });
  EXPECT_NE(e.find("'/dev/shm' is on tmpfs, which keeps its files in RAM"), std::string::npos) << e;
}

TEST(FileArena, ChecksRoomForTheWholeStateWhenAFileCannotHoldIt) {
  TempDir dir;
  mt::FileArena arena(dir.path());
  // More than any disk here: the whole-size probe is refused (EFBIG: past ext4's largest file, or ENOSPC), and
  // the free space that statvfs reports is named.
  const std::size_t huge = std::size_t{1} << 60;
  const std::string e = error_of([&] { arena.check_room(huge, 1 << 20); });
  EXPECT_NE(e.find(fmt::format("has no room for the optimizer state of {} bytes", huge)), std::string::npos) << e;
  EXPECT_TRUE(dir.entries().empty()) << "the probe files are gone";
}

TEST(TrainerOffload, ConfigNamesWhatItCannotDo) {
  using mt::train::offload_directory;
  EXPECT_EQ(offload_directory("none"), "");
  EXPECT_EQ(offload_directory("file:/scratch/x"), "/scratch/x");
  EXPECT_NE(error_of([] { offload_directory("host"); }).find("not built yet"), std::string::npos);
  EXPECT_NE(error_of([] { offload_directory("file:"); }).find("offload_optimizer 'file:' is not"), std::string::npos);
  EXPECT_NE(error_of([] { offload_directory("disk"); }).find("offload_optimizer 'disk' is not"), std::string::npos);
  mt::train::TrainerConfig c = offload_config("");
  c.offload_optimizer = "file:/tmp";
  EXPECT_EQ(mt::train::TrainerConfig::from_json(c.to_json()).offload_optimizer, "file:/tmp");
  c.device = mt::Device::cuda();
  EXPECT_NE(error_of([&] { c.validate(); }).find("a device run's state lives on the device"), std::string::npos);
}

// The prediction leaves the state out of the peaks, as the run's allocator does.
TEST(TrainerOffload, PredictionLeavesTheStateOutOfThePeaks) {
  TempDir dir;
  mt::train::TrainerConfig c = offload_config("");
  mt::train::RunInputs inputs;
  inputs.make_model = [] { return std::make_shared<mt::nn::GPT>(small_gpt()); };
  inputs.make_loss = [](const std::shared_ptr<mt::nn::Module>& m) {
    return mt::test_support::gpt_loss(std::static_pointer_cast<mt::nn::GPT>(m));
  };
  inputs.train = std::make_shared<mt::test_support::TokenDataset>(16, 16, 64);
  const mt::train::MemoryPrediction in_memory = mt::train::predict_memory(c, inputs);
  c.offload_optimizer = "file:" + dir.path();
  const mt::train::MemoryPrediction offloaded = mt::train::predict_memory(c, inputs);
  EXPECT_GT(in_memory.category_peak_bytes.at("optimizer_state"), 0u);
  EXPECT_EQ(offloaded.category_peak_bytes.at("optimizer_state"), 0u);
  EXPECT_LT(offloaded.peak_bytes_total, in_memory.peak_bytes_total);
}

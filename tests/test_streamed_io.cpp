// Streamed checkpoint files: a save writes each tensor from its live buffer (a tensor that is not contiguous in
// host memory through one staging buffer of at most io::kStagingBytes), and a load reads each tensor straight
// into the parameter or state it restores, so neither holds a second copy of the model or the optimizer state.
// The bounds are read from the allocator's byte accounting; the values against the tensors written.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "temp_dir.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::Tensor;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

mt::Allocator& host() { return mt::Allocator::get(mt::Device::cpu()); }

// The most live host bytes `run` adds above what was live before it.
std::size_t peak_growth(const std::function<void()>& run) {
  const std::size_t before = host().stats().live_bytes;
  host().reset_peak();
  run();
  return host().stats().peak_bytes - before;
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.detach().to(mt::DType::f32).contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// A transposed view (not contiguous) of 48 MiB is written through the staging buffer: the file holds its
// values in the view's order, and the save never holds more than the buffer besides.
TEST(StreamedIo, SaveWritesAStridedTensorThroughTheBoundedBuffer) {
  mt::test_support::TempDir dir;
  mt::manual_seed(3);
  const Tensor base = mt::randn({3072, 4096});
  const Tensor view = base.t();  // [4096, 3072], strides [1, 4096]
  ASSERT_FALSE(view.is_contiguous());
  const std::string path = dir.file("strided.safetensors");
  const std::size_t growth = peak_growth([&] { mt::io::save_safetensors(path, {{"w", view}}); });
  EXPECT_LE(growth, mt::io::kStagingBytes + kMiB) << "a save made more than the staging buffer";
  const mt::io::SafetensorsFile file(path);
  const Tensor back = file.read("w");
  ASSERT_EQ(back.shape(), view.shape());
  EXPECT_EQ(values(back), values(view));
}

// read_into a destination of another dtype and a strided one: the values arrive converted and in place,
// through at most the staging buffer.
TEST(StreamedIo, ReadIntoConvertsAndFillsStridedDestinationsInPieces) {
  mt::test_support::TempDir dir;
  mt::manual_seed(4);
  const Tensor w = mt::randn({2048, 4096});  // 32 MiB of f32
  const std::string path = dir.file("w.safetensors");
  mt::io::save_safetensors(path, {{"w", w}});
  const mt::io::SafetensorsFile file(path);

  Tensor narrow = mt::zeros({2048, 4096}, mt::DType::bf16);
  const std::size_t growth = peak_growth([&] { file.read_into("w", narrow); });
  EXPECT_LE(growth, mt::io::kStagingBytes + kMiB);
  EXPECT_EQ(values(narrow), values(w.to(mt::DType::bf16)));

  Tensor store = mt::zeros({4096, 2048});
  Tensor strided = store.t();  // [2048, 4096] over store's storage
  const std::size_t strided_growth = peak_growth([&] { file.read_into("w", strided); });
  EXPECT_LE(strided_growth, mt::io::kStagingBytes + kMiB);
  EXPECT_EQ(values(store), values(w.t()));  // written into store, transposed
}

TEST(StreamedIo, ReadIntoRefusesAnotherShapeNamingFileAndTensor) {
  mt::test_support::TempDir dir;
  const std::string path = dir.file("s.safetensors");
  mt::io::save_safetensors(path, {{"w", mt::zeros({3, 4})}});
  const mt::io::SafetensorsFile file(path);
  Tensor wrong = mt::zeros({4, 3});
  const std::string msg = mt::test_support::error_of([&] { file.read_into("w", wrong); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  EXPECT_NE(mt::test_support::error_of([&] { file.read_into("v", wrong); }).find("no tensor 'v'"),
            std::string::npos);
  EXPECT_FALSE(file.info("v").has_value());
}

// A range of a tensor's elements (a ZeRO shard's piece of a saved state) reads those elements, in any dtype;
// a range past the end is refused naming the file, the tensor and the range.
TEST(StreamedIo, ReadRangeIntoReadsThoseElementsAndRefusesARangePastTheEnd) {
  mt::test_support::TempDir dir;
  const std::string path = dir.file("r.safetensors");
  std::vector<float> v(12);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f;
  mt::io::save_safetensors(path, {{"w", mt::tensor(v, {3, 4})}});
  const mt::io::SafetensorsFile file(path);
  Tensor piece = mt::zeros({5}, mt::DType::f64);
  file.read_range_into("w", 6, piece);
  EXPECT_EQ(values(piece), std::vector<float>(v.begin() + 6, v.begin() + 11));
  Tensor too_long = mt::zeros({7});
  const std::string msg = mt::test_support::error_of([&] { file.read_range_into("w", 6, too_long); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6, 13)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
}

mt::nn::GPTConfig gpt_of_7_mib() {
  mt::nn::GPTConfig c;
  c.vocab_size = 512;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 256;
  c.dropout = 0.0;
  return c;
}

// A resume reads the checkpoint into the fresh trainer's parameters and its new AdamW state directly: the load's
// peak is what the trainer holds after it (plus a little), where reading the file first held the model and the
// state twice (19.5 MiB more here). The resumed run continues as the saved one did.
TEST(StreamedIo, CheckpointLoadHoldsTheModelAndStateOnce) {
  mt::test_support::TempDir dir;
  mt::train::TrainerConfig c = mt::test_support::quiet_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-3});
  c.micro_batch = 2;
  c.checkpoint_dir = dir.path();
  // No loader thread: its prefetched batches, dropped by the resume's seek, would move the live bytes measured
  // below by a timing-dependent 512 B.
  c.data.prefetch = 0;
  auto ds = std::make_shared<mt::test_support::TokenDataset>(8, 16, 512);

  mt::manual_seed(5);
  auto a = std::make_shared<mt::nn::GPT>(gpt_of_7_mib());
  mt::train::Trainer saved(c, a, mt::test_support::gpt_loss(a), ds);
  saved.train_step();
  saved.train_step();
  const std::size_t save_growth = peak_growth([&] { saved.save_checkpoint(); });
  EXPECT_LE(save_growth, kMiB) << "a CPU save copied tensors";
  const double next_loss = saved.train_step().loss;

  mt::manual_seed(6);
  auto b = std::make_shared<mt::nn::GPT>(gpt_of_7_mib());
  mt::train::Trainer resumed(c, b, mt::test_support::gpt_loss(b), ds);
  const std::size_t before = host().stats().live_bytes;
  host().reset_peak();
  ASSERT_TRUE(resumed.resume_latest());
  const std::size_t after = host().stats().live_bytes;
  const std::size_t state = resumed.optimizer().state_bytes();
  ASSERT_GT(state, 10 * kMiB);  // AdamW's two moments of ~1.8 M parameters
  EXPECT_GE(after - before, state);  // the state is there...
  EXPECT_LE(host().stats().peak_bytes, after + kMiB) << "...and was not read into memory first";
  EXPECT_EQ(resumed.train_step().loss, next_loss);
}

}  // namespace

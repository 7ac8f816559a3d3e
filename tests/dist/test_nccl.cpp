// dist::make_nccl_communicator: without a GPU for every rank, every rank refuses together naming the reason
// (never a hang); with one, the NCCL group's collectives on device tensors give the bits the serial canonical
// tree gives (tests/dist/dist_test_util.h), like the MPI backend's, data parallel training of a CUDA model over
// it gives the run alone's bits, and a tensor on another device is refused.
#include "dist_test_util.h"

#include "memtrain/core/rng.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/train/trainer.h"

#include "tiny_lm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace mt = memtrain;
namespace dist = memtrain::dist;
using namespace memtrain::dist_test;
using ::testing::AnyOf;
using ::testing::HasSubstr;

namespace {

// The NCCL group over world(), or nullptr and why not (every rank gets the same answer).
std::pair<std::shared_ptr<dist::Communicator>, std::string> nccl_group() {
  try {
    return {dist::make_nccl_communicator(dist::world()), ""};
  } catch (const mt::Error& e) {
    return {nullptr, e.what()};
  }
}

mt::Device my_gpu() { return mt::Device::cuda(dist::world()->local_rank()); }

}  // namespace

TEST(Nccl, EveryRankRefusesTogetherNamingTheReasonWithoutAGpuEach) {
  auto world = dist::world();
  const std::vector<std::int64_t> gpus = world->all_gather_i64({mt::cuda::device_count(), world->local_rank()});
  bool every_rank_has_one = true;
  for (std::size_t q = 0; q < gpus.size(); q += 2) every_rank_has_one &= gpus[q + 1] < gpus[q];
  if (every_rank_has_one) GTEST_SKIP() << "every rank has a GPU of its own: the group is made (tests below)";
  const auto [group, why] = nccl_group();
  EXPECT_EQ(group, nullptr);
  EXPECT_THAT(why, HasSubstr("dist::make_nccl_communicator"));
  EXPECT_THAT(why, AnyOf(HasSubstr("has no usable CUDA device"), HasSubstr("NCCL takes one GPU per rank"),
                         HasSubstr("built without NCCL"), HasSubstr("no CUDA backend")));
  world->barrier();  // every rank got here: none is left waiting in the bootstrap
}

TEST(Nccl, CanonicalSumsOnTheDeviceHaveTheSerialTreesBits) {
  const auto [nccl, why] = nccl_group();
  if (!nccl) GTEST_SKIP() << why;
  EXPECT_EQ(nccl->backend(), "nccl");
  const int size = nccl->size(), me = nccl->rank();
  const std::int64_t numel = 1000 + 3 * size;
  const std::vector<std::int64_t> bounds = dist::shard_bounds(numel, size, 8);
  for (mt::DType dtype : {mt::DType::f32, mt::DType::f64, mt::DType::bf16, mt::DType::f16}) {
    std::vector<mt::Tensor> leaves;
    for (int q = 0; q < size; ++q) leaves.push_back(leaf_tensor(21, q, numel, dtype));
    const mt::Tensor expected = serial_canonical_sum(leaves, bounds[me], bounds[me + 1]);
    mt::Tensor mine = mt::zeros({bounds[me + 1] - bounds[me]}, dtype).to(my_gpu());
    nccl->reduce_scatter_canonical(leaves[me].to(my_gpu()), bounds, mine);
    EXPECT_TRUE(same_bits(mine.to(mt::Device::cpu()), expected)) << mt::dtype_name(dtype);

    mt::Tensor whole = leaves[me].to(my_gpu());
    nccl->all_reduce_canonical(whole);
    EXPECT_TRUE(same_bits(whole.to(mt::Device::cpu()), serial_canonical_sum(leaves, 0, numel)))
        << mt::dtype_name(dtype);
  }
}

TEST(Nccl, AllReduceGatherAndBroadcastMoveTheValues) {
  const auto [nccl, why] = nccl_group();
  if (!nccl) GTEST_SKIP() << why;
  const int size = nccl->size(), me = nccl->rank();
  // Small integers: every summation order gives the same, exact, sum.
  for (mt::DType dtype : {mt::DType::f32, mt::DType::bf16}) {
    mt::Tensor t = mt::full({37}, me + 1.0, dtype, my_gpu());
    nccl->all_reduce_sum(t);
    EXPECT_TRUE(same_bits(t.to(mt::Device::cpu()), mt::full({37}, size * (size + 1) / 2.0, dtype)))
        << mt::dtype_name(dtype);
  }
  std::vector<std::int64_t> bounds{0};
  for (int q = 0; q < size; ++q) bounds.push_back(bounds.back() + (q == 1 ? 0 : 5 * q + 2));  // rank 1: empty
  const mt::Tensor expected = leaf_tensor(3, 0, bounds.back(), mt::DType::f32);
  mt::Tensor full = mt::zeros({bounds.back()}, mt::DType::f32).to(my_gpu());
  nccl->all_gather(part(expected, bounds[me], bounds[me + 1]).to(my_gpu()), bounds, full);
  EXPECT_TRUE(same_bits(full.to(mt::Device::cpu()), expected));

  const int root = size - 1;
  const mt::Tensor roots = leaf_tensor(11, root, 77, mt::DType::bf16);
  mt::Tensor t = (me == root ? roots : mt::zeros({77}, mt::DType::bf16)).to(my_gpu());
  nccl->broadcast(t, root);
  EXPECT_TRUE(same_bits(t.to(mt::Device::cpu()), roots));
  nccl->barrier();
}

// Data parallel training of a CUDA model over the NCCL group (one GPU per rank; at world size 1, the group of
// one that a single GPU allows): the tiny GPT's 10 steps give the losses and weights, bit for bit, of the same
// global batch trained alone on the GPU with the canonical reduction.
TEST(Nccl, DataParallelOnTheGpusGivesTheRunAlonesBits) {
  const auto [nccl, why] = nccl_group();
  if (!nccl) GTEST_SKIP() << why;
  const auto run = [](std::int64_t ranks, const std::shared_ptr<dist::Communicator>& group) {
    mt::train::TrainerConfig c = mt::test_support::short_run_config();
    c.device = my_gpu();
    c.micro_batch = 2;
    c.grad_clip = 1.0;
    c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
    c.world_size = ranks;
    c.grad_accum = 4 / ranks;
    c.canonical_reduction = true;
    c.zero = ranks > 1 ? 1 : 0;
    mt::manual_seed(11);
    auto model = mt::test_support::make_tiny_lm(false);
    auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                                 mt::test_support::kTinyVocab);
    mt::train::Trainer trainer(c, model, mt::test_support::tiny_lm_loss(model, false), data);
    if (group) trainer.set_gradient_sync(std::make_shared<dist::DataParallel>(group));
    std::vector<double> losses;
    while (trainer.step() < c.max_steps) losses.push_back(trainer.train_step().loss);
    std::vector<float> weights;
    for (const auto& [name, p] : model->named_parameters()) {
      const mt::Tensor h = p.detach().to(mt::Device::cpu()).contiguous();
      weights.insert(weights.end(), h.data<float>(), h.data<float>() + h.numel());
    }
    return std::pair{losses, weights};
  };
  if (nccl->size() > 4 || 4 % nccl->size() != 0) GTEST_SKIP() << "the global batch of 4 needs 1, 2 or 4 ranks";
  const auto alone = run(1, nullptr);
  const auto ranks = run(nccl->size(), nccl);
  EXPECT_EQ(ranks.first, alone.first);
  ASSERT_EQ(ranks.second.size(), alone.second.size());
  EXPECT_EQ(std::memcmp(ranks.second.data(), alone.second.data(), alone.second.size() * sizeof(float)), 0);
  EXPECT_NE(alone.first.front(), alone.first.back());
}

TEST(Nccl, RefusesAHostTensorNamingTheOperation) {
  const auto [nccl, why] = nccl_group();
  if (!nccl) GTEST_SKIP() << why;
  mt::Tensor host = mt::zeros({4});
  try {
    nccl->all_reduce_sum(host);
    ADD_FAILURE() << "a CPU tensor was accepted";
  } catch (const mt::Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("all_reduce_sum: t is on cpu"));
  }
}

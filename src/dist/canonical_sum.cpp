// The tree is evaluated block by block (kBlock elements at a time) so its partial sums stay in cache: per
// block, a depth-first walk of the tree with one scratch row per level.
#include "dist/canonical_sum.h"

#include "core/convert.h"
#include "memtrain/core/error.h"
#include "memtrain/dist/communicator.h"

#include <algorithm>
#include <type_traits>

namespace memtrain::dist::detail {
namespace {

constexpr std::int64_t kBlock = 4096;

template <typename Acc>
class BlockTree {
 public:
  BlockTree(const std::vector<const void*>& leaves, DType dtype)
      : leaves_(leaves), dtype_(dtype), scratch_(tree_depth(static_cast<std::int64_t>(leaves.size())),
                                                 std::vector<Acc>(kBlock)) {}

  // dst[0..len) := the tree over all leaves of elements [begin, begin + len).
  void evaluate(std::int64_t begin, std::int64_t len, Acc* dst) {
    evaluate(0, static_cast<std::int64_t>(leaves_.size()), 0, begin, len, dst);
  }

 private:
  static std::size_t tree_depth(std::int64_t leaves) {
    std::size_t depth = 0;
    for (; leaves > 1; leaves = canonical_split(leaves)) ++depth;  // the left subtree is the deeper one
    return depth;
  }

  void evaluate(std::int64_t lo, std::int64_t n, std::size_t level, std::int64_t begin, std::int64_t len, Acc* dst) {
    if (n == 1) {
      const auto* leaf = static_cast<const std::byte*>(leaves_[static_cast<std::size_t>(lo)]);
      ::memtrain::detail::convert(leaf + begin * static_cast<std::int64_t>(dtype_size(dtype_)), dtype_, dst, dtype_of_acc(),
              static_cast<std::size_t>(len));
      return;
    }
    const std::int64_t p = canonical_split(n);
    evaluate(lo, p, level + 1, begin, len, dst);
    Acc* right = scratch_[level].data();
    evaluate(lo + p, n - p, level + 1, begin, len, right);
    for (std::int64_t i = 0; i < len; ++i) dst[i] = dst[i] + right[i];  // left operand first
  }

  static constexpr DType dtype_of_acc() { return std::is_same_v<Acc, double> ? DType::f64 : DType::f32; }

  const std::vector<const void*>& leaves_;
  DType dtype_;
  std::vector<std::vector<Acc>> scratch_;
};

template <typename Acc>
void canonical_sum_in(const std::vector<const void*>& leaves, DType dtype, std::int64_t n, void* out) {
  BlockTree<Acc> tree(leaves, dtype);
  // A separate result row, converted into `out` once the block is done: `out` may be one of the leaves.
  std::vector<Acc> block(kBlock);
  auto* out_bytes = static_cast<std::byte*>(out);
  const auto esize = static_cast<std::int64_t>(dtype_size(dtype));
  constexpr DType acc_dtype = std::is_same_v<Acc, double> ? DType::f64 : DType::f32;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t len = std::min(kBlock, n - begin);
    tree.evaluate(begin, len, block.data());
    ::memtrain::detail::convert(block.data(), acc_dtype, out_bytes + begin * esize, dtype, static_cast<std::size_t>(len));
  }
}

}  // namespace

void canonical_sum(const std::vector<const void*>& leaves, DType dtype, std::int64_t n, void* out) {
  MT_CHECK(!leaves.empty(), "canonical_sum", "no contributions");
  switch (dtype) {
    case DType::f64: return canonical_sum_in<double>(leaves, dtype, n, out);
    case DType::f32: case DType::bf16: case DType::f16: return canonical_sum_in<float>(leaves, dtype, n, out);
    default: MT_CHECK(false, "canonical_sum", "cannot sum {}", dtype_name(dtype));
  }
}

}  // namespace memtrain::dist::detail

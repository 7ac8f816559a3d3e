// Block-wise 8-bit encoding and decoding on L1-resident data: 32 blocks of 256 values, each block with its
// own scale, as the fused 8-bit optimizer steps see them. Signed map on normal values (first moments),
// unsigned map on squared normal values (second moments). Encoders compared in the same run: the one
// encode_block uses (arithmetic with AVX-512, else the table), the register search tree (AVX-512 only; the
// arithmetic encoder's fallback), the table encoder (encode_block_scalar) and the binary search
// (quantize_nearest). Counter items_per_second = values per second; the arithmetic encoder's rows also count
// tree_groups: the share of 16-lane groups it hands to the search tree, over 4096 fresh blocks of the same
// distribution. docs/results/optim_cpu.md has figures.
#include "memtrain/optim/quantized_state.h"
#include "cpu/quantized_kernels.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using namespace memtrain::optim;

constexpr int kBlocks = 32;
constexpr int kBlock = 256;

struct Blocks {
  std::vector<float> values, scales;
  std::vector<std::uint8_t> codes;
  explicit Blocks(QuantMap kind, int count = kBlocks, unsigned seed = 5)
      : values(count * kBlock), scales(count), codes(count * kBlock) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int b = 0; b < count; ++b) {
      for (int i = 0; i < kBlock; ++i) {
        const float g = normal(gen);
        values[b * kBlock + i] = kind == QuantMap::signed_dynamic ? g : g * g;
      }
      scales[b] = detail::block_scale(values.data() + b * kBlock, kBlock);
    }
  }
};

enum Encoder { kBuilt, kTree, kTable, kBinarySearch };

#if defined(MEMTRAIN_OPTIM_AVX512)
// The share of 16-lane groups in which detail::arith_encode_one is unsure of some lane.
double tree_group_share(QuantMap kind) {
  constexpr int kCount = 4096;
  const Blocks blocks(kind, kCount, 17);
  const detail::EncodeTable& table = detail::encode_table(kind);
  std::int64_t unsure = 0;
  for (int group = 0; group < kCount * kBlock / 16; ++group) {
    const float inv = 1.0f / blocks.scales[group * 16 / kBlock];
    bool any = false;
    for (int i = 0; i < 16; ++i) {
      bool uncertain = false;
      detail::arith_encode_one(blocks.values[group * 16 + i] * inv, table, uncertain);
      any = any || uncertain;
    }
    unsure += any ? 1 : 0;
  }
  return static_cast<double>(unsure) / (kCount * kBlock / 16);
}
#endif

#if defined(MEMTRAIN_OPTIM_AVX512)
template <int Levels>
void encode_tree(const float* src, float scale, const detail::EncodeTable& t, std::uint8_t* codes) {
  const detail::TreeRegs<Levels> r(t);
  const __m512 inv = _mm512_set1_ps(1.0f / scale);
  for (int i = 0; i < kBlock; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(src + i), inv);
    __m512i c;
    if constexpr (Levels == 7) c = detail::encode16_signed(r, x);
    else c = detail::encode16_unsigned(r, x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(c));
  }
}
#endif

void BM_Encode(benchmark::State& state, QuantMap kind, Encoder encoder) {
#if !defined(MEMTRAIN_OPTIM_AVX512)
  if (encoder == kTree) {
    state.SkipWithError("built without AVX-512");
    return;
  }
#endif
  Blocks blocks(kind);
  const float* map = dynamic_map(kind).data();
  [[maybe_unused]] const detail::EncodeTable& table = detail::encode_table(kind);
  for (auto _ : state) {
    for (int b = 0; b < kBlocks; ++b) {
      const float* src = blocks.values.data() + b * kBlock;
      std::uint8_t* codes = blocks.codes.data() + b * kBlock;
      const float scale = blocks.scales[b];
      switch (encoder) {
        case kBuilt: detail::encode_block(src, kBlock, scale, map, codes); break;
        case kTree:
#if defined(MEMTRAIN_OPTIM_AVX512)
          if (table.tree_levels == 7) encode_tree<7>(src, scale, table, codes);
          else encode_tree<8>(src, scale, table, codes);
#endif
          break;
        case kTable: detail::encode_block_scalar(src, kBlock, scale, map, codes); break;
        case kBinarySearch:
          for (int i = 0; i < kBlock; ++i) codes[i] = detail::quantize_nearest(src[i] * (1.0f / scale), map);
          break;
      }
    }
    benchmark::DoNotOptimize(blocks.codes.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlocks * kBlock);
#if defined(MEMTRAIN_OPTIM_AVX512)
  if (encoder == kBuilt) state.counters["tree_groups"] = tree_group_share(kind);
#endif
}

void BM_Decode(benchmark::State& state, QuantMap kind) {
  Blocks blocks(kind);
  const float* map = dynamic_map(kind).data();
  for (int b = 0; b < kBlocks; ++b)
    detail::encode_block(blocks.values.data() + b * kBlock, kBlock, blocks.scales[b], map,
                         blocks.codes.data() + b * kBlock);
  std::vector<float> out(kBlocks * kBlock);
  for (auto _ : state) {
    for (int b = 0; b < kBlocks; ++b)
      detail::dequantize_block(blocks.codes.data() + b * kBlock, kBlock, blocks.scales[b], map,
                               out.data() + b * kBlock);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlocks * kBlock);
}

const QuantMap kSigned = QuantMap::signed_dynamic, kUnsigned = QuantMap::unsigned_dynamic;
BENCHMARK_CAPTURE(BM_Encode, signed_built, kSigned, kBuilt);
BENCHMARK_CAPTURE(BM_Encode, signed_tree, kSigned, kTree);
BENCHMARK_CAPTURE(BM_Encode, signed_table, kSigned, kTable);
BENCHMARK_CAPTURE(BM_Encode, signed_binary_search, kSigned, kBinarySearch);
BENCHMARK_CAPTURE(BM_Encode, unsigned_built, kUnsigned, kBuilt);
BENCHMARK_CAPTURE(BM_Encode, unsigned_tree, kUnsigned, kTree);
BENCHMARK_CAPTURE(BM_Encode, unsigned_table, kUnsigned, kTable);
BENCHMARK_CAPTURE(BM_Encode, unsigned_binary_search, kUnsigned, kBinarySearch);
BENCHMARK_CAPTURE(BM_Decode, signed, kSigned);
BENCHMARK_CAPTURE(BM_Decode, unsigned, kUnsigned);

}  // namespace

BENCHMARK_MAIN();

// GPU GEMM throughput of cuda::gemm_lt (cuBLASLt) in TFLOP/s (2*M*N*K per product), for f32, TF32, bf16
// and fp8 (E4M3 x E4M3 -> bf16, per-tensor scales), on square products and GPT-2 124M training shapes at
// B*T = 8192 tokens. scripts/device/gemm_peer.py measures the same cases with PyTorch.
//
//   ./bench_cuda_gemm [out.json]
//
// Method: random inputs (never zeros); 3 warm-up products, then 30 products timed one by one with CUDA
// events enqueued back to back (cuda::time_reps_ms), reported as the median. The products rotate among
// enough input/output buffer sets that one pass over them is at least 4x the 60 MB L2 of an H100/H200,
// so small shapes are not timed from a warm cache. Layouts: row-major, C[M,N] = A[M,K] B[K,N] with A and
// B stored as written, except fp8, which cuBLASLt takes only with B stored [N,K] (both K-contiguous).
// Without a CUDA device it prints "no CUDA device: <reason>" and exits 0.
//
// A plain main(): bench/CMakeLists.txt links Google Benchmark into every bench_*, which is harmless here.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/gemm_lt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace memtrain;

constexpr std::int64_t kL2Bytes = 60'000'000;  // H100/H200 L2
constexpr int kWarmup = 3;
constexpr int kReps = 30;

struct Shape {
  const char* name;
  std::int64_t m, n, k;
};

const Shape kShapes[] = {
    {"square_4096", 4096, 4096, 4096},
    {"square_8192", 8192, 8192, 8192},
    {"gpt2_qkv", 8192, 2304, 768},        // [8192x768] x [768x2304]
    {"gpt2_fc", 8192, 3072, 768},         // [8192x768] x [768x3072]
    {"gpt2_proj", 8192, 768, 3072},       // [8192x3072] x [3072x768]
    {"gpt2_lm_head", 8192, 50304, 768},   // [8192x768] x [768x50304]
};

struct Precision {
  const char* name;
  DType in;
  DType in_b;
  DType out;
  bool tf32;
};

const Precision kPrecisions[] = {
    {"f32", DType::f32, DType::f32, DType::f32, false},
    {"tf32", DType::f32, DType::f32, DType::f32, true},
    {"bf16", DType::bf16, DType::bf16, DType::bf16, false},
    {"fp8_e4m3", DType::f8_e4m3, DType::f8_e4m3, DType::bf16, false},
};

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n random nonzero values of dtype t as bytes: f32 in +-[2^-4, 2), bf16 likewise, fp8 E4M3 in +-[2^-3, 8).
std::vector<std::uint8_t> random_bytes(DType t, std::size_t n) {
  std::vector<std::uint8_t> out(n * dtype_size(t));
  std::uint64_t s = 12345 + static_cast<std::uint64_t>(t);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = splitmix(s);
    const auto sign = static_cast<std::uint32_t>(r & 1);
    const auto e = static_cast<std::uint32_t>((r >> 1) % 5);  // 5 binades
    if (t == DType::f32) {
      const std::uint32_t bits = (sign << 31) | ((123 + e) << 23) | static_cast<std::uint32_t>((r >> 8) & 0x7fffff);
      std::memcpy(&out[4 * i], &bits, 4);
    } else if (t == DType::bf16) {
      const auto bits = static_cast<std::uint16_t>((sign << 15) | ((123 + e) << 7) | ((r >> 8) & 0x7f));
      std::memcpy(&out[2 * i], &bits, 2);
    } else {  // E4M3: exponent field 4..8, never the NaN pattern
      out[i] = static_cast<std::uint8_t>((sign << 7) | ((4 + e) << 3) | ((r >> 8) & 0x7));
    }
  }
  return out;
}

// Random host values per input dtype, large enough for every operand of every shape.
const std::vector<std::uint8_t>& pool(DType t) {
  static std::map<DType, std::vector<std::uint8_t>> pools;
  auto it = pools.find(t);
  if (it != pools.end()) return it->second;
  std::size_t most = 0;
  for (const Shape& s : kShapes) most = std::max<std::size_t>({most, std::size_t(s.m * s.k), std::size_t(s.k * s.n)});
  return pools.emplace(t, random_bytes(t, most)).first->second;
}

struct Result {
  std::string shape, precision;
  std::int64_t m = 0, n = 0, k = 0;
  int sets = 0;
  double median_ms = 0, tflops = 0;
  std::string error;
};

Result run_case(const Shape& s, const Precision& p) {
  Result r;
  r.shape = s.name;
  r.precision = p.name;
  r.m = s.m;
  r.n = s.n;
  r.k = s.k;
  Allocator& alloc = Allocator::get(Device::cuda(0));
  const bool f8 = p.in == DType::f8_e4m3;
  const std::size_t bytes_a = s.m * s.k * dtype_size(p.in), bytes_b = s.k * s.n * dtype_size(p.in_b);
  const std::size_t bytes_c = s.m * s.n * dtype_size(p.out);
  const std::size_t set_bytes = bytes_a + bytes_b + bytes_c;
  r.sets = static_cast<int>(std::clamp<std::int64_t>((4 * kL2Bytes + set_bytes - 1) / set_bytes, 2, 64));
  std::vector<Block> blocks;
  try {
    const std::vector<std::uint8_t>& host_a = pool(p.in);
    const std::vector<std::uint8_t>& host_b = pool(p.in_b);
    std::vector<void*> a(r.sets), b(r.sets), c(r.sets);
    for (int i = 0; i < r.sets; ++i) {
      for (auto [ptr, bytes] : {std::pair{&a[i], bytes_a}, std::pair{&b[i], bytes_b}, std::pair{&c[i], bytes_c}}) {
        blocks.push_back(alloc.allocate(bytes, MemoryCategory::other));
        *ptr = blocks.back().ptr;
      }
      cuda::copy(a[i], Device::cuda(0), host_a.data(), Device::cpu(), bytes_a);
      cuda::copy(b[i], Device::cuda(0), host_b.data(), Device::cpu(), bytes_b);
    }
    // Per-tensor scales of 1, in separate allocations: cuBLASLt wants them 16-byte aligned.
    const float one = 1.f;
    const float* scales[2];
    for (const float*& scale : scales) {
      blocks.push_back(alloc.allocate(sizeof(float), MemoryCategory::other));
      cuda::copy(blocks.back().ptr, Device::cuda(0), &one, Device::cpu(), sizeof(one));
      scale = static_cast<const float*>(blocks.back().ptr);
    }

    cuda::GemmLtArgs g;
    g.a_type = p.in;
    g.b_type = p.in_b;
    g.c_type = p.out;
    g.allow_tf32 = p.tf32;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.lda = s.k;
    g.trans_b = f8;  // fp8: B stored [N, K]
    g.ldb = f8 ? s.k : s.n;
    g.ldc = s.n;
    if (f8) {
      g.a_scale = scales[0];
      g.b_scale = scales[1];
    }
    auto product = [&](int i) {
      const int set = i % r.sets;
      cuda::gemm_lt(g, a[set], b[set], c[set], 0);
    };
    for (int i = 0; i < kWarmup; ++i) product(i);
    std::vector<float> ms = cuda::time_reps_ms(0, kReps, product);
    std::sort(ms.begin(), ms.end());
    r.median_ms = kReps % 2 ? ms[kReps / 2] : 0.5 * (double(ms[kReps / 2 - 1]) + ms[kReps / 2]);
    r.tflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / (r.median_ms * 1e-3) / 1e12;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  for (const Block& blk : blocks) alloc.deallocate(blk);
  alloc.empty_cache();
  return r;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("no CUDA device: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  std::vector<Result> results;
  for (const Shape& s : kShapes) {
    for (const Precision& p : kPrecisions) {
      results.push_back(run_case(s, p));
      const Result& r = results.back();
      if (r.error.empty()) {
        std::fprintf(stderr, "%s %s: %.4f ms, %.1f TFLOP/s (%d buffer sets)\n", r.shape.c_str(), r.precision.c_str(),
                     r.median_ms, r.tflops, r.sets);
      } else {
        std::fprintf(stderr, "%s %s: error: %s\n", r.shape.c_str(), r.precision.c_str(), r.error.c_str());
      }
    }
  }

  std::string table = "| shape | M | N | K |";
  for (const Precision& p : kPrecisions) table += fmt::format(" {} |", p.name);
  table += "\n|---|---:|---:|---:|";
  for (std::size_t i = 0; i < std::size(kPrecisions); ++i) table += "---:|";
  table += "\n";
  for (const Shape& s : kShapes) {
    table += fmt::format("| {} | {} | {} | {} |", s.name, s.m, s.n, s.k);
    for (const Precision& p : kPrecisions) {
      for (const Result& r : results) {
        if (r.shape == s.name && r.precision == p.name) {
          table += r.error.empty() ? fmt::format(" {:.1f} |", r.tflops) : std::string(" error |");
        }
      }
    }
    table += "\n";
  }
  std::printf("memtrain cuda::gemm_lt (cuBLASLt), TFLOP/s, median of %d; fp8 = E4M3 x E4M3 -> bf16\n\n%s", kReps,
              table.c_str());

  if (argc > 1) {
    std::string json = fmt::format("{{\n  \"tool\": \"memtrain cuda::gemm_lt\",\n  \"reps\": {},\n  \"warmup\": {},\n"
                                   "  \"l2_bytes_assumed\": {},\n  \"results\": [\n",
                                   kReps, kWarmup, kL2Bytes);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      json += fmt::format(
          "    {{\"shape\": \"{}\", \"precision\": \"{}\", \"m\": {}, \"n\": {}, \"k\": {}, \"buffer_sets\": {}, "
          "\"median_ms\": {:.6f}, \"tflops\": {:.3f}, \"error\": {}}}{}\n",
          r.shape, r.precision, r.m, r.n, r.k, r.sets, r.median_ms, r.tflops,
          r.error.empty() ? std::string("null") : "\"" + json_escape(r.error) + "\"",
          i + 1 < results.size() ? "," : "");
    }
    json += "  ]\n}\n";
    std::FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr || std::fputs(json.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "cannot write %s\n", argv[1]);
      return 1;
    }
  }
  return 0;
}

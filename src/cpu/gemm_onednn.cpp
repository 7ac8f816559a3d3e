// oneDNN GEMM backend. f32 goes through dnnl_sgemm (row-major BLAS-style, strides and transposes passed
// straight through). bf16 goes through the matmul primitive, whose memory descriptors carry the strides
// (a transposed operand is just a [rows, cols] view with strides {1, ld}); alpha is an output scale and
// beta a sum post-op. Creating a primitive costs far more than a small GEMM, so primitives are kept in a
// small LRU keyed by everything that shapes them, including the thread count, which oneDNN fixes at
// creation. Without MEMTRAIN_HAVE_ONEDNN only the stubs at the end are compiled.
#include "cpu/gemm_impl.h"
#include "memtrain/core/error.h"

#if defined(MEMTRAIN_HAVE_ONEDNN)

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <bit>
#include <compare>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

namespace memtrain::detail {
namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

struct MatmulKey {
  bool in_bf16 = false, trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 0, stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t alpha_bits = 0, beta_bits = 0;
  int threads = 0;
  auto operator<=>(const MatmulKey&) const = default;
};

struct Matmul {
  bool usable = false;  // false: this CPU has no fast implementation, so the caller falls back
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, dst;
};

// One operand as oneDNN sees it: logical [batch,] rows x cols with explicit strides. A batch stride of 0
// (one matrix shared by every entry) becomes a batch dimension of 1, which matmul broadcasts.
dnnl::memory::desc operand_desc(dnnl::memory::data_type dt, int64_t batch, int64_t batch_stride, int64_t rows,
                                int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (batch == 1) return dnnl::memory::desc({rows, cols}, dt, dnnl::memory::dims{row_stride, col_stride});
  const int64_t b = batch_stride == 0 ? 1 : batch;
  const int64_t bs = batch_stride == 0 ? rows * cols : batch_stride;
  return dnnl::memory::desc({b, rows, cols}, dt, dnnl::memory::dims{bs, row_stride, col_stride});
}

std::shared_ptr<const Matmul> create_matmul(const MatmulKey& key, float alpha, float beta) {
  using dt = dnnl::memory::data_type;
  const dt in = key.in_bf16 ? dt::bf16 : dt::f32;
  auto mm = std::make_shared<Matmul>();
  // op(A)[m,k]: stored [k,m] when transposed, so element (i,l) sits at l*lda + i.
  mm->src = operand_desc(in, key.batch, key.stride_a, key.m, key.k, key.trans_a ? 1 : key.lda,
                         key.trans_a ? key.lda : 1);
  mm->weights = operand_desc(in, key.batch, key.stride_b, key.k, key.n, key.trans_b ? 1 : key.ldb,
                             key.trans_b ? key.ldb : 1);
  mm->dst = operand_desc(dt::f32, key.batch, key.stride_c, key.m, key.n, key.ldc, 1);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // dst = beta * dst + alpha * A * B
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm->src, mm->weights, mm->dst), attr, cpu_engine());
    // The reference kernels are correct but orders of magnitude slower than widening to f32 and running
    // sgemm, so they count as "no implementation".
    if (std::string_view(pd.impl_info_str()).starts_with("ref")) return mm;
    mm->primitive = dnnl::matmul(pd);
    mm->usable = true;
  } catch (const dnnl::error&) {
    // e.g. bf16 on a CPU without AVX-512: oneDNN 2.6 offers no matmul at all.
  }
  return mm;
}

class MatmulCache {
 public:
  std::shared_ptr<const Matmul> get(const MatmulKey& key, float alpha, float beta) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    // Created outside the lock: it takes milliseconds. A concurrent creator of the same key just wins.
    auto created = create_matmul(key, alpha, beta);
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    lru_.emplace_front(key, created);
    index_.emplace(key, lru_.begin());
    if (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return created;
  }

  int64_t size() {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(lru_.size());
  }

 private:
  // Enough for every distinct GEMM of a transformer's step (a few dozen) with room to spare.
  static constexpr size_t kCapacity = 256;
  using Entry = std::pair<MatmulKey, std::shared_ptr<const Matmul>>;
  std::mutex mutex_;
  std::list<Entry> lru_;
  std::map<MatmulKey, std::list<Entry>::iterator> index_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

}  // namespace

void onednn_gemm_f32(const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c) {
  // Status codes are gathered rather than thrown, since the batch may run inside an OpenMP region.
  std::atomic<int> failed{dnnl_success};
  for_each_gemm_in_batch(d, [&](int64_t i) {
    const dnnl_status_t st =
        dnnl_sgemm(d.trans_a ? 'T' : 'N', d.trans_b ? 'T' : 'N', d.m, d.n, d.k, alpha, a + i * d.stride_a,
                   d.lda, b + i * d.stride_b, d.ldb, beta, c + i * d.stride_c, d.ldc);
    if (st != dnnl_success) failed.store(st);
  });
  MT_CHECK(failed.load() == dnnl_success, "gemm", "oneDNN sgemm failed with status {} (m={} n={} k={})",
           failed.load(), d.m, d.n, d.k);
}

bool onednn_matmul(bool in_bf16, const GemmDims& d, float alpha, const void* a, const void* b, float beta,
                   float* c) {
  MatmulKey key;
  key.in_bf16 = in_bf16;
  key.trans_a = d.trans_a;
  key.trans_b = d.trans_b;
  key.m = d.m, key.n = d.n, key.k = d.k;
  key.lda = d.lda, key.ldb = d.ldb, key.ldc = d.ldc;
  key.batch = d.batch;
  // Strides of a single product do not shape the primitive; zero them so such calls share an entry.
  key.stride_a = d.batch > 1 ? d.stride_a : 0;
  key.stride_b = d.batch > 1 ? d.stride_b : 0;
  key.stride_c = d.batch > 1 ? d.stride_c : 0;
  key.alpha_bits = std::bit_cast<uint32_t>(alpha);
  key.beta_bits = std::bit_cast<uint32_t>(beta);
  key.threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const auto mm = matmul_cache().get(key, alpha, beta);
  if (!mm->usable) return false;

  thread_local dnnl::stream stream(cpu_engine());
  try {
    dnnl::memory src(mm->src, cpu_engine(), const_cast<void*>(a));
    dnnl::memory weights(mm->weights, cpu_engine(), const_cast<void*>(b));
    dnnl::memory dst(mm->dst, cpu_engine(), c);
    mm->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw_error("gemm", fmt::format("oneDNN matmul failed: {} (m={} n={} k={} batch={})", e.what(), d.m, d.n,
                                    d.k, d.batch));
  }
  return true;
}

int64_t onednn_matmul_cache_size() { return matmul_cache().size(); }

}  // namespace memtrain::detail

#else  // !MEMTRAIN_HAVE_ONEDNN

namespace memtrain::detail {

// gemm.cpp never selects oneDNN in this build; these keep the symbols (and the tests) link-compatible.
void onednn_gemm_f32(const GemmDims&, float, const float*, const float*, float, float*) {
  throw_error("gemm", "this build of memtrain has no oneDNN");
}
bool onednn_matmul(bool, const GemmDims&, float, const void*, const void*, float, float*) { return false; }
int64_t onednn_matmul_cache_size() { return 0; }

}  // namespace memtrain::detail

#endif  // MEMTRAIN_HAVE_ONEDNN

// The CPU backend's memory and tensor-core entries (src/cpu/cpu_backend.h), and the backend object.
#include "cpu/cpu_backend.h"

#include "cpu/convert.h"
#include "cpu/strided.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace memtrain::cpu {

namespace {

// Host memory: 64-byte aligned. Pages are touched by whoever writes first; the cache keeps them mapped.
// Segments of kMapBytes and more are mapped from the OS and unmapped when the allocator hands them back (its
// reserve limit, empty_cache), so those bytes leave the process at once: from malloc they would stay in its
// heap, whose mmap threshold rises to the largest block freed (up to 32 MiB). Smaller ones come from malloc.
class HostMemorySource final : public MemorySource {
 public:
  static constexpr std::size_t kMapBytes = std::size_t{1} << 20;

  void* raw_allocate(std::size_t nbytes) override {
    if (nbytes >= kMapBytes) {
      void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        throw Error(fmt::format("allocator(cpu): out of host memory mapping {} bytes: {}", nbytes,
                                std::strerror(errno)));
      // Large tensors are read in long runs: 2 MiB pages cut the page faults and TLB misses of a fresh block.
      ::madvise(p, nbytes, MADV_HUGEPAGE);
      return p;
    }
    void* p = std::aligned_alloc(64, nbytes);
    if (p == nullptr) throw Error(fmt::format("allocator(cpu): out of host memory allocating {} bytes", nbytes));
    return p;
  }
  void raw_free(void* ptr, std::size_t nbytes) override {
    if (nbytes >= kMapBytes) {
      ::munmap(ptr, nbytes);
      return;
    }
    std::free(ptr);
  }
};

}  // namespace

std::unique_ptr<MemorySource> CpuBackend::make_memory_source(int) const {
  return std::make_unique<HostMemorySource>();
}

void CpuBackend::fill(const Tensor& dst, double value) const {
  if (!runs_kernels()) return;
  std::uint64_t pattern = 0;
  write_from_double(&pattern, dst.dtype(), value);
  // Broadcast one element over the view: a stride-0 source.
  strided_copy(dst.data_ptr(), dst.strides(), &pattern, Shape(dst.dim(), 0), dst.shape(), dst.element_size());
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) const {
  if (src.dtype() == dst.dtype()) {
    if (runs_kernels())
      strided_copy(dst.data_ptr(), dst.strides(), src.data_ptr(), src.strides(), dst.shape(), dst.element_size());
    return;
  }
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (runs_kernels())
      convert(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), static_cast<std::size_t>(dst.numel()));
    return;
  }
  copy(dst, src.contiguous().to(dst.dtype()));  // convert first, then lay out
}

void CpuBackend::transfer(const Tensor&, const Tensor&) const {
  MT_CHECK(false, "transfer", "the CPU backend has no other side to transfer to");
}

double CpuBackend::read_scalar(const Tensor& t) const { return read_as_double(t.data_ptr(), t.dtype()); }

void CpuBackend::fill_random(const Tensor& dst, const RngState& state, bool normal) const {
  // The stream is drawn as f32 and rounded once to dst's dtype.
  const Tensor f = dst.dtype() == DType::f32 ? dst : Tensor::empty(dst.shape(), DType::f32, dst.device());
  if (runs_kernels()) {
    if (normal) fill_normal(f.data<float>(), f.numel(), state);
    else fill_uniform(f.data<float>(), f.numel(), state);
  }
  if (f.dtype() != dst.dtype()) copy(dst, f);
}

// ---- helpers of the entries ----

Tensor compute_operand(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor c = t.detach().to(compute_dtype(t.dtype()));
  return c.is_contiguous() ? c : c.contiguous();
}

Tensor compute_result(const Tensor& dst, DType ct) {
  if (!dst.defined()) return dst;
  if (dst.dtype() == ct && dst.is_contiguous()) return dst;
  return Tensor::empty(dst.shape(), ct, dst.device());
}

void finish_result(const Tensor& dst, const Tensor& computed) {
  if (!dst.defined() || computed.shares_storage_with(dst)) return;  // computed in place
  Tensor(dst).copy_(computed);
}

}  // namespace memtrain::cpu

namespace memtrain::detail {

const Backend& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}

}  // namespace memtrain::detail

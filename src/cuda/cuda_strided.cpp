// CUDA backend, host side of cuda/strided.h: argument checks, merging the layout down to the
// fewest dims, and the dispatch to kernels/strided_copy.cuh (or cudaMemcpyAsync when both sides are one
// contiguous run).
//
// The entry point checks its arguments first (so bad arguments throw before any device is touched), then
// requires the device, makes it current and enqueues on its current stream (cuda/stream.h).
// Overlapping source and destination go through a workspace block from the device's Allocator, returned
// to its cache once the copies are enqueued (the cache hands it only to work enqueued later on the same
// stream; see cuda_nn.cpp).
#include "cuda/strided.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/cuda_common.h"
#include "kernels/strided_copy.cuh"

#include <cstdint>
#include <limits>
#include <vector>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;
constexpr const char* kOp = "cuda::strided_copy";

struct Dim {
  std::int64_t size;
  std::int64_t dst;  // stride in elements
  std::int64_t src;
};

// The same copy with fewer dims: size-1 dims and dims of stride 0 on both sides (every index moves the
// same element to the same place) are dropped; a dim merges into its outer neighbour when both sides
// continue the neighbour's run (outer stride == size * stride). Sizes here are >= 1 (no empty extents).
std::vector<Dim> simplify(const std::vector<Dim>& dims) {
  std::vector<Dim> out;
  for (const Dim& d : dims) {
    if (d.size == 1 || (d.dst == 0 && d.src == 0)) continue;
    if (!out.empty() && out.back().dst == d.size * d.dst && out.back().src == d.size * d.src) {
      out.back() = Dim{out.back().size * d.size, d.dst, d.src};
    } else {
      out.push_back(d);
    }
  }
  return out;
}

// Byte range [lo, hi) that one side of the copy touches (strides may be negative).
struct Range {
  std::intptr_t lo, hi;
};
Range byte_range(const void* base, const std::vector<Dim>& dims, bool dst_side, std::size_t elem_size) {
  std::int64_t lo = 0, hi = 0;  // element offsets, checked not to overflow by the caller
  for (const Dim& d : dims) {
    const std::int64_t reach = (d.size - 1) * (dst_side ? d.dst : d.src);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto b = reinterpret_cast<std::intptr_t>(base);
  const auto es = static_cast<std::intptr_t>(elem_size);
  return {b + static_cast<std::intptr_t>(lo) * es, b + (static_cast<std::intptr_t>(hi) + 1) * es};
}

std::int64_t count_of(const std::vector<Dim>& dims) {
  std::int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

// Enqueues the copy of an already simplified layout; dims beyond the kernel's 8 are looped here.
void enqueue(char* dst, const char* src, const Dim* dims, int ndim, std::size_t elem_size) {
  if (ndim == 0 || (ndim == 1 && dims[0].dst == 1 && dims[0].src == 1)) {
    const std::size_t nbytes = static_cast<std::size_t>(ndim == 0 ? 1 : dims[0].size) * elem_size;
    MT_CUDA_CHECK(kOp, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyDeviceToDevice, launch_stream());
    return;
  }
  if (ndim > kStridedCopyMaxDims) {
    const auto es = static_cast<std::int64_t>(elem_size);
    for (std::int64_t i = 0; i < dims[0].size; ++i)
      enqueue(dst + i * dims[0].dst * es, src + i * dims[0].src * es, dims + 1, ndim - 1, elem_size);
    return;
  }
  StridedCopyLayout layout;
  layout.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    layout.shape[d] = dims[d].size;
    layout.dst_strides[d] = dims[d].dst;
    layout.src_strides[d] = dims[d].src;
  }
  MT_CUDA_CHECK(kOp, launch_strided_copy, dst, src, layout, elem_size, launch_stream());
}

void enqueue(void* dst, const void* src, const std::vector<Dim>& dims, std::size_t elem_size) {
  enqueue(static_cast<char*>(dst), static_cast<const char*>(src), dims.data(), static_cast<int>(dims.size()),
          elem_size);
}

}  // namespace

void strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                  const std::int64_t* shape, int ndim, std::size_t elem_size, int device) {
  MT_CHECK(ndim >= 0, kOp, "negative rank {}", ndim);
  MT_CHECK(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8, kOp,
           "element size {} is not supported (1, 2, 4 or 8 bytes)", elem_size);
  MT_CHECK(ndim == 0 || (shape != nullptr && dst_strides != nullptr && src_strides != nullptr), kOp,
           "null shape or strides for rank {}", ndim);
  std::vector<Dim> dims(static_cast<std::size_t>(ndim));
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    MT_CHECK(shape[d] >= 0, kOp, "negative extent {} in dim {}", shape[d], d);
    dims[static_cast<std::size_t>(d)] = Dim{shape[d], dst_strides[d], src_strides[d]};
    empty = empty || shape[d] == 0;
  }
  if (empty) return;
  MT_CHECK(dst != nullptr && src != nullptr, kOp, "null pointer");
  // Element count and every offset (size * |stride| per dim, and their sums) must fit in int64.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t n = 1, dst_reach = 0, src_reach = 0;
  for (int d = 0; d < ndim; ++d) {
    const Dim& x = dims[static_cast<std::size_t>(d)];
    const std::int64_t a = x.dst < 0 ? -x.dst : x.dst, b = x.src < 0 ? -x.src : x.src;
    const bool fits = x.dst != std::numeric_limits<std::int64_t>::min() &&
                      x.src != std::numeric_limits<std::int64_t>::min() && n <= kMax / x.size &&
                      (a == 0 || x.size <= kMax / a) && (b == 0 || x.size <= kMax / b) &&
                      dst_reach <= kMax - x.size * a && src_reach <= kMax - x.size * b;
    MT_CHECK(fits, kOp, "extent {} with strides {} (destination) / {} (source) in dim {} overflows 64-bit offsets",
             x.size, x.dst, x.src, d);
    n *= x.size;
    dst_reach += x.size * a;
    src_reach += x.size * b;
  }
  MT_CHECK(static_cast<std::uint64_t>(n) <= std::numeric_limits<std::size_t>::max() / elem_size, kOp,
           "{} elements of {} bytes overflow size_t", n, elem_size);

  const std::vector<Dim> simple = simplify(dims);
  detail::require_device(kOp, device);
  bool same_layout = dst == src;
  for (const Dim& d : simple) same_layout = same_layout && d.dst == d.src;
  if (same_layout) return;  // every element would be copied onto itself
  detail::DeviceGuard guard(device, kOp);

  const Range rd = byte_range(dst, simple, true, elem_size), rs = byte_range(src, simple, false, elem_size);
  if (rd.lo < rs.hi && rs.lo < rd.hi) {
    // Overlap: snapshot the source into a contiguous block, then lay it out.
    const std::int64_t count = count_of(simple);
    Allocator& allocator = Allocator::get(Device::cuda(device));
    const Block scratch = allocator.allocate(static_cast<std::size_t>(count) * elem_size, MemoryCategory::workspace);
    try {
      std::vector<Dim> in = simple, out = simple;
      std::int64_t stride = 1;
      for (std::size_t i = simple.size(); i-- > 0;) {
        in[i].dst = stride;
        out[i].src = stride;
        stride *= simple[i].size;
      }
      enqueue(scratch.ptr, src, simplify(in), elem_size);
      enqueue(dst, scratch.ptr, simplify(out), elem_size);
    } catch (...) {
      allocator.deallocate(scratch);
      throw;
    }
    allocator.deallocate(scratch);
    return;
  }
  enqueue(dst, src, simple, elem_size);
}

}  // namespace memtrain::cuda

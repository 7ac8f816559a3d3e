// dist::Communicator over NCCL, between the GPUs of one run (one per rank). Compiled into the CUDA module, not
// libmemtrain (dist/nccl_backend.h), with NCCL when cmake found it (MEMTRAIN_HAVE_NCCL); otherwise its entry
// says so.
//
// Bootstrap (as llm.c does): rank 0 makes the NCCL unique id and broadcasts it over the launcher's MPI group,
// then every rank joins with ncclCommInitRank on cuda:<local rank>.
// Streams: collectives run on the communicator's own (blocking) stream. Each one first waits (an event, no host
// sync) for the work the calling thread's current stream has enqueued so far, and that stream then waits for
// the collective before anything later runs on it, so callers order tensors exactly as with a kernel launch.
// The canonical sums exchange parts with grouped send/receive and add them on the device in the canonical tree
// order: each `+` is one exactly rounded f32 (or f64) add, as on the CPU, so the bits equal the MPI backend's.
// Host values (all_gather_f64/i64, broadcast_string) go over the MPI group.
// Faults: NCCL does not time out by itself; the host wait of barrier() polls the stream and
// ncclCommGetAsyncError, and past timeout_seconds() aborts the communicator and raises dist::PeerTimeout.
// Other collectives return at once; a dead peer then shows at the next barrier or host synchronisation.
#include "dist/nccl_backend.h"

#include <memory>
#include <string>

#if MEMTRAIN_HAVE_NCCL

#include "core/cuda_module.h"
#include "dist/collective_checks.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/ops/elementwise.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace memtrain::dist::detail {
namespace {

constexpr const char* kWhere = "NcclCommunicator";

void check_cuda(cudaError_t err, const char* fn) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clears the runtime's error slot, so a later launch check does not see it again
  MT_CHECK(false, kWhere, "{} failed: {}: {}", fn, cudaGetErrorName(err), cudaGetErrorString(err));
}

// The CUDA module's answers (core/cuda_module.h): this file is built into the module, so it is loaded.
const ::memtrain::detail::CudaModule& module() {
  std::string why;
  const ::memtrain::detail::CudaModule* m = ::memtrain::detail::cuda_module(why);
  MT_CHECK(m != nullptr, kWhere, "no CUDA backend: {}", why);
  return *m;
}

// Makes `device` current for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

void check_nccl(ncclResult_t result, std::string_view op, const char* fn) {
  MT_CHECK(result == ncclSuccess || result == ncclInProgress, kWhere, "{}: {} failed: {}", op, fn,
           ncclGetErrorString(result));
}

ncclDataType_t nccl_type(DType dtype, std::string_view op) {
  switch (dtype) {
    case DType::f64: return ncclFloat64;
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: break;
  }
  MT_CHECK(false, kWhere, "{}: NCCL does not sum {}", op, dtype_name(dtype));
  return ncclFloat32;
}

// bf16 and f16 are summed in f32, as the MPI backend does (NCCL would add in the narrow type at every hop).
DType accumulation_type(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, int device)
      : bootstrap_(std::move(bootstrap)), device_(device) {
    set_timeout_seconds(bootstrap_->timeout_seconds());
    ncclUniqueId id;
    if (bootstrap_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "init", "ncclGetUniqueId");
    // The id travels as bytes over the MPI group.
    Tensor bytes = Tensor::empty({static_cast<std::int64_t>(sizeof(id))}, DType::u8, Device::cpu());
    if (bootstrap_->rank() == 0) std::memcpy(bytes.data_ptr(), &id, sizeof(id));
    bootstrap_->broadcast(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
    DeviceScope on_device(device_);
    // Blocking, as memtrain's own streams (cuda/stream.h): the legacy default stream's copies wait for it.
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_nccl(ncclCommInitRank(&comm_, bootstrap_->size(), id, bootstrap_->rank()), "init", "ncclCommInitRank");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) aborted_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (after_ != nullptr) cudaEventDestroy(after_);
    if (before_ != nullptr) cudaEventDestroy(before_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  int local_rank() const override { return bootstrap_->local_rank(); }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  void barrier() override {
    constexpr std::string_view op = "barrier";
    std::lock_guard lock(mutex_);
    Tensor token = Tensor::empty({1}, DType::f32, Device::cuda(device_));
    enqueue(op, [&] {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream_);
    });
    wait(op);
  }

  void broadcast(Tensor& t, int root) override {
    constexpr std::string_view op = "broadcast";
    check_root(op, root, size());
    check_device_tensor(op, t, "t");
    // Every rank must pass the same shape and dtype: compared over the MPI group, naming both.
    const std::string mine = fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype()));
    const std::string roots = bootstrap_->broadcast_string(mine, root);
    MT_CHECK(roots == mine, kWhere, "{}: rank {} passes {} but root {} passes {}", op, rank(), mine, root, roots);
    std::lock_guard lock(mutex_);
    enqueue(op, [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_);
    });
  }

  std::string broadcast_string(const std::string& s, int root) override {
    return bootstrap_->broadcast_string(s, root);
  }
  std::vector<double> all_gather_f64(const std::vector<double>& mine) override {
    return bootstrap_->all_gather_f64(mine);
  }
  std::vector<std::int64_t> all_gather_i64(const std::vector<std::int64_t>& mine) override {
    return bootstrap_->all_gather_i64(mine);
  }

  void all_reduce_sum(Tensor& t) override {
    constexpr std::string_view op = "all_reduce_sum";
    check_device_tensor(op, t, "t");
    check_summable(op, t.dtype());
    autograd::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    const DType acc = accumulation_type(t.dtype());
    const bool widened = t.dtype() != acc;
    Tensor sum = widened ? t.to(acc) : t;
    enqueue(op, [&] {
      return ncclAllReduce(sum.data_ptr(), sum.data_ptr(), static_cast<std::size_t>(sum.numel()), nccl_type(acc, op),
                           ncclSum, comm_, stream_);
    });
    if (widened) t.copy_(sum);  // one rounding, at the end
  }

  void reduce_scatter_canonical(const Tensor& contribution, const std::vector<std::int64_t>& bounds,
                                Tensor& mine) override {
    constexpr std::string_view op = "reduce_scatter_canonical";
    check_device_tensor(op, contribution, "contribution");
    check_device_tensor(op, mine, "mine");
    check_shard_layout(op, *this, contribution, bounds, mine);
    check_summable(op, contribution.dtype());
    autograd::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    const int me = rank();
    const std::int64_t part = mine.numel();
    // Every other rank's part `me`, one slot per rank (this rank's slot unused).
    Tensor received = Tensor::empty({part * size()}, contribution.dtype(), Device::cuda(device_));
    const ncclDataType_t type = nccl_type(contribution.dtype(), op);
    const std::size_t esize = contribution.element_size();
    enqueue(op, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < size() && r == ncclSuccess; ++q) {
        if (q == me) continue;
        const std::int64_t lo = bounds[static_cast<std::size_t>(q)], hi = bounds[static_cast<std::size_t>(q) + 1];
        if (part > 0)
          r = ncclRecv(static_cast<std::byte*>(received.data_ptr()) + static_cast<std::size_t>(part * q) * esize,
                       static_cast<std::size_t>(part), type, q, comm_, stream_);
        if (r == ncclSuccess && hi > lo)
          r = ncclSend(static_cast<const std::byte*>(contribution.data_ptr()) + static_cast<std::size_t>(lo) * esize,
                       static_cast<std::size_t>(hi - lo), type, q, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess ? end : r;
    });
    if (part == 0) return;
    std::vector<Tensor> leaves;
    for (int q = 0; q < size(); ++q)
      leaves.push_back(q == me ? contribution.narrow(0, bounds[static_cast<std::size_t>(me)], part)
                               : received.narrow(0, part * q, part));
    mine.copy_(tree(leaves, 0, size(), accumulation_type(contribution.dtype())));
  }

  void all_gather(const Tensor& mine, const std::vector<std::int64_t>& bounds, Tensor& full) override {
    constexpr std::string_view op = "all_gather";
    check_device_tensor(op, mine, "mine");
    check_device_tensor(op, full, "full");
    check_shard_layout(op, *this, full, bounds, mine);
    std::lock_guard lock(mutex_);
    const std::size_t esize = full.element_size();
    // Parts of any size: one broadcast per rank, rooted at it, all in one group.
    enqueue(op, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < size() && r == ncclSuccess; ++q) {
        const std::int64_t lo = bounds[static_cast<std::size_t>(q)], hi = bounds[static_cast<std::size_t>(q) + 1];
        if (hi == lo) continue;
        auto* part = static_cast<std::byte*>(full.data_ptr()) + static_cast<std::size_t>(lo) * esize;
        r = ncclBroadcast(mine.data_ptr(), part, static_cast<std::size_t>(hi - lo) * esize, ncclUint8, q, comm_,
                          stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess ? end : r;
    });
  }

 private:
  void check_device_tensor(std::string_view op, const Tensor& t, std::string_view what) const {
    MT_CHECK(t.defined() && t.is_contiguous(), kWhere, "{}: {} must be a defined, contiguous tensor", op, what);
    MT_CHECK(t.device() == Device::cuda(device_), kWhere, "{}: {} is on {}, but rank {} communicates on cuda:{}", op,
             what, t.device().str(), rank(), device_);
  }

  // Enqueues `call` (the NCCL calls) on the communicator's stream after the current stream's work so far,
  // and makes the current stream wait for it.
  template <typename Call>
  void enqueue(std::string_view op, Call&& call) {
    MT_CHECK(!aborted_, kWhere, "{}: the communicator was aborted after an earlier failure", op);
    DeviceScope on_device(device_);
    const auto compute = static_cast<cudaStream_t>(module().current_stream(device_));
    check_cuda(cudaEventRecord(before_, compute), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, before_, 0), "cudaStreamWaitEvent");
    check_nccl(call(), op, "the NCCL call");
    check_cuda(cudaEventRecord(after_, stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(compute, after_, 0), "cudaStreamWaitEvent");
  }

  // The host waits for the communicator's stream, at most timeout_seconds().
  void wait(std::string_view op) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) check_cuda(done, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), op, "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        MT_CHECK(false, kWhere, "{}: rank {}: NCCL reports {}", op, rank(), ncclGetErrorString(async));
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_seconds()) {
        aborted_ = true;
        throw PeerTimeout(fmt::format("{}: {}: rank {} waited {:.0f} s for its peers (timeout_seconds {}); "
                                            "a rank died or is stuck", kWhere, op, rank(), waited, timeout_seconds()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // The canonical tree over leaves [lo, lo + n) in `acc` (communicator.h): left subtree first.
  static Tensor tree(const std::vector<Tensor>& leaves, int lo, int n, DType acc) {
    if (n == 1) {
      const Tensor& leaf = leaves[static_cast<std::size_t>(lo)];
      return leaf.dtype() == acc ? leaf : leaf.to(acc);
    }
    const int p = static_cast<int>(canonical_split(n));
    return ops::add(tree(leaves, lo, p, acc), tree(leaves, lo + p, n - p, acc));
  }

  std::shared_ptr<Communicator> bootstrap_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  bool aborted_ = false;
  std::mutex mutex_;
};

// The group over `bootstrap`'s ranks on cuda:<local rank>, once every rank is known to have its GPU.
std::shared_ptr<Communicator> make_group(std::shared_ptr<Communicator> bootstrap, std::string& why) {
  const int devices = module().device_count();
  const int local = bootstrap->local_rank();
  // Every rank learns whether every rank has its GPU before any joins NCCL, so all refuse together.
  const std::vector<std::int64_t> gpus = bootstrap->all_gather_i64({devices, local});
  for (std::size_t q = 0; q + 1 < gpus.size(); q += 2) {
    if (gpus[q] == 0) {
      why = fmt::format("rank {} has no usable CUDA device{}", q / 2,
                        static_cast<int>(q / 2) == bootstrap->rank() ? ": " + module().unavailable_reason()
                                                                     : std::string());
      return nullptr;
    }
    if (gpus[q + 1] >= gpus[q]) {
      why = fmt::format("rank {} is local rank {} on a host with {} usable GPU(s): NCCL takes one GPU per rank "
                        "(launch at most {} ranks per host)", q / 2, gpus[q + 1], gpus[q], gpus[q]);
      return nullptr;
    }
  }
  return std::make_shared<NcclCommunicator>(std::move(bootstrap), local);
}

}  // namespace
}  // namespace memtrain::dist::detail

#else  // no NCCL in this build

namespace memtrain::dist::detail {
namespace {

std::shared_ptr<Communicator> make_group(std::shared_ptr<Communicator>, std::string& why) {
  why = "memtrain was built without NCCL (cmake did not find nccl.h and libnccl; set MEMTRAIN_NCCL_ROOT)";
  return nullptr;
}

}  // namespace
}  // namespace memtrain::dist::detail

#endif

extern "C" __attribute__((visibility("default"))) const memtrain::dist::detail::NcclGroupEntry* memtrain_nccl_group() {
  static const memtrain::dist::detail::NcclGroupEntry entry{.make = &memtrain::dist::detail::make_group};
  return &entry;
}

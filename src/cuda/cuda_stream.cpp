// Streams, events, and the per-thread current stream (src/cuda/stream.h).
//
// The current stream is thread-local state: one slot per device, nullptr (the legacy default stream)
// unless a StreamGuard is active. `t_active` counts non-default slots so that current_stream() without a
// device answers the common case (no guard anywhere on this thread) without asking CUDA for the device.
#include "cuda/stream.h"

#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"

#include <array>
#include <utility>

namespace memtrain::cuda {

namespace {

constexpr int kMaxDevices = 64;  // as Allocator::get
thread_local std::array<cudaStream_t, kMaxDevices> t_current{};
thread_local int t_active = 0;

cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }
cudaEvent_t as_event(void* p) { return static_cast<cudaEvent_t>(p); }

// A query's answer: true for cudaSuccess, false for cudaErrorNotReady (not an error: work is pending, and
// the runtime's last-error slot is cleared); anything else throws naming `op` and `fn`.
bool finished(cudaError_t err, const char* op, const char* fn) {
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  detail::check_cuda(err, op, fn);
  return true;
}

// synchronize() and query() of a Stream or an Event: the same moved-from check around CUDA's own call, named
// `fn` in errors. A query's cudaErrorNotReady is an answer (see finished).
template <typename Handle>
void host_wait(void* handle, const char* op, const char* what, cudaError_t (*wait)(Handle), const char* fn) {
  MT_CHECK(handle != nullptr, op, "moved-from {}", what);
  detail::check_cuda(wait(static_cast<Handle>(handle)), op, fn);
}

template <typename Handle>
bool host_query(void* handle, const char* op, const char* what, cudaError_t (*query)(Handle), const char* fn) {
  MT_CHECK(handle != nullptr, op, "moved-from {}", what);
  return finished(query(static_cast<Handle>(handle)), op, fn);
}

}  // namespace

namespace detail {

cudaStream_t current_stream(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return t_current[static_cast<std::size_t>(device)];
}

cudaStream_t current_stream() {
  if (t_active == 0) return nullptr;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cuda::current_stream", "cudaGetDevice");
  return current_stream(device);
}

cudaStream_t exchange_current_stream(int device, cudaStream_t stream) {
  MT_CHECK(device >= 0 && device < kMaxDevices, "cuda::StreamGuard", "bad device index {}", device);
  cudaStream_t& slot = t_current[static_cast<std::size_t>(device)];
  const cudaStream_t previous = slot;
  t_active += (stream != nullptr) - (previous != nullptr);
  slot = stream;
  return previous;
}

}  // namespace detail

// ---- Stream ----

Stream::Stream(int device) {
  constexpr const char* op = "cuda::Stream";
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  cudaStream_t s = nullptr;
  // Default flags = a blocking stream, ordered with the legacy default stream (see the header).
  MT_CUDA_CHECK(op, cudaStreamCreate, &s);
  handle_ = s;
  device_ = device;
}

Stream::~Stream() { release(); }

void Stream::release() noexcept {
  if (handle_ == nullptr) return;
  // Wait first: a destroyed stream's handle can come back from cudaStreamCreate, and the allocator keys
  // its segments by handle, so none of this stream's work may still be running then. Errors here
  // (e.g. at process exit) cannot be reported from a destructor.
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  cudaStreamSynchronize(as_stream(handle_));
  cudaStreamDestroy(as_stream(handle_));
  if (switched) cudaSetDevice(previous);
  cudaGetLastError();
  handle_ = nullptr;
}

void Stream::wait(const Event& event) const {
  constexpr const char* op = "cuda::Stream::wait";
  MT_CHECK(handle_ != nullptr && event.handle() != nullptr, op, "moved-from stream or event");
  detail::DeviceGuard guard(device_, op);
  MT_CUDA_CHECK(op, cudaStreamWaitEvent, as_stream(handle_), as_event(event.handle()), 0u);
}

void Stream::synchronize() const {
  host_wait(handle_, "cuda::Stream::synchronize", "stream", cudaStreamSynchronize, "cudaStreamSynchronize");
}

bool Stream::query() const {
  return host_query(handle_, "cuda::Stream::query", "stream", cudaStreamQuery, "cudaStreamQuery");
}

// ---- Event ----

Event::Event(int device) {
  constexpr const char* op = "cuda::Event";
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  cudaEvent_t e = nullptr;
  MT_CUDA_CHECK(op, cudaEventCreate, &e);  // default flags: timing enabled, blocking sync off
  handle_ = e;
  device_ = device;
}

Event::~Event() { release(); }

void Event::release() noexcept {
  if (handle_ == nullptr) return;
  cudaEventDestroy(as_event(handle_));  // safe while pending: resources go when the event completes
  cudaGetLastError();
  handle_ = nullptr;
}

void Event::record(const Stream& stream) {
  constexpr const char* op = "cuda::Event::record";
  MT_CHECK(handle_ != nullptr && stream.handle() != nullptr, op, "moved-from event or stream");
  MT_CHECK(stream.device() == device_, op, "event of cuda:{} recorded on a stream of cuda:{}", device_,
           stream.device());
  detail::DeviceGuard guard(device_, op);
  MT_CUDA_CHECK(op, cudaEventRecord, as_event(handle_), as_stream(stream.handle()));
}

void Event::record() {
  constexpr const char* op = "cuda::Event::record";
  MT_CHECK(handle_ != nullptr, op, "moved-from event");
  detail::DeviceGuard guard(device_, op);
  MT_CUDA_CHECK(op, cudaEventRecord, as_event(handle_), detail::current_stream(device_));
}

void Event::synchronize() const {
  host_wait(handle_, "cuda::Event::synchronize", "event", cudaEventSynchronize, "cudaEventSynchronize");
}

bool Event::query() const {
  return host_query(handle_, "cuda::Event::query", "event", cudaEventQuery, "cudaEventQuery");
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  constexpr const char* op = "cuda::Event::elapsed_ms";
  MT_CHECK(start.handle_ != nullptr && end.handle_ != nullptr, op, "moved-from event");
  MT_CHECK(start.device_ == end.device_, op, "events of cuda:{} and cuda:{}", start.device_, end.device_);
  float ms = 0.0f;
  MT_CUDA_CHECK(op, cudaEventElapsedTime, &ms, as_event(start.handle_), as_event(end.handle_));
  return ms;
}

// ---- StreamGuard ----

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()) {
  MT_CHECK(stream.handle() != nullptr, "cuda::StreamGuard", "moved-from stream");
  previous_ = detail::exchange_current_stream(device_, as_stream(stream.handle()));
}

StreamGuard::~StreamGuard() { detail::exchange_current_stream(device_, as_stream(previous_)); }

bool default_stream_is_current(int device) { return detail::current_stream(device) == nullptr; }

}  // namespace memtrain::cuda

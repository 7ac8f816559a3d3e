// CUDA streams and events, and the per-thread "current stream" every memtrain launch goes to.
//
// Each thread has, per device, a current stream: the legacy default stream unless a StreamGuard made
// another one current. Every memtrain kernel, cuBLAS/cuBLASLt, cuDNN and cuSOLVER call on a device is
// enqueued on that device's current stream, so work submitted under one StreamGuard may overlap work on
// another stream, and ordering between streams is expressed with events (Event::record, Stream::wait).
//
// Streams are created BLOCKING (cudaStreamCreate's default flags): the legacy default stream waits for
// them and they wait for it. cuda::copy (cudaMemcpy on the legacy stream) therefore still returns only
// after every kernel enqueued before it on any memtrain stream has finished, and work enqueued after a
// copy sees its bytes. A non-blocking stream would race with those copies.
//
// Memory: the device allocator serves a request only from segments that belong to the current stream
// (see src/core/segment_pool.h), so a block freed while stream A's kernels may still use it is never
// handed to work on stream B. A tensor allocated on one stream and used on another is the caller's
// responsibility: record an event after the last use on the other stream and make the allocating
// stream wait on it before the tensor is freed (there is no record_stream).
//
// Without CUDA (or without a device) creating a Stream or Event throws "cuda::Stream: ..." / "cuda::Event:
// ..."; default_stream_is_current() answers true.
#pragma once

#include <utility>

namespace memtrain::cuda {

class Event;

namespace detail {

// The owned (handle, device) pair of Stream and Event: movable, not copyable. A move leaves the source
// empty (nullptr, device -1); assigning over an owner first has Owner::release() free what it held.
template <typename Owner>
class OwnedHandle {
 public:
  OwnedHandle(const OwnedHandle&) = delete;
  OwnedHandle& operator=(const OwnedHandle&) = delete;

  int device() const { return device_; }
  // The cudaStream_t / cudaEvent_t (void* keeps CUDA headers out of here); nullptr once moved from.
  void* handle() const { return handle_; }

 protected:
  OwnedHandle() = default;
  ~OwnedHandle() = default;
  OwnedHandle(OwnedHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), device_(std::exchange(other.device_, -1)) {}
  OwnedHandle& operator=(OwnedHandle&& other) noexcept {
    if (this != &other) {
      static_cast<Owner*>(this)->release();
      handle_ = std::exchange(other.handle_, nullptr);
      device_ = std::exchange(other.device_, -1);
    }
    return *this;
  }

  void* handle_ = nullptr;
  int device_ = -1;
};

}  // namespace detail

// An owned CUDA stream on one device.
class Stream : public detail::OwnedHandle<Stream> {
 public:
  explicit Stream(int device = 0);  // throws naming cuda::Stream when the device is not usable
  // Waits for the stream's work, then destroys it: the handle may be reused by a later stream, and the
  // allocator's blocks of this stream must not be lent to new work while old work still runs.
  ~Stream();
  Stream(Stream&& other) noexcept = default;
  Stream& operator=(Stream&& other) noexcept = default;

  void wait(const Event& event) const;  // later work on this stream waits for the event (host does not)
  void synchronize() const;             // the host waits for all work enqueued on this stream
  bool query() const;                   // true when all work enqueued on this stream has finished

 private:
  friend class detail::OwnedHandle<Stream>;
  void release() noexcept;
};

// An owned CUDA event on one device, with timing enabled.
class Event : public detail::OwnedHandle<Event> {
 public:
  explicit Event(int device = 0);  // throws naming cuda::Event when the device is not usable
  ~Event();
  Event(Event&& other) noexcept = default;
  Event& operator=(Event&& other) noexcept = default;

  void record(const Stream& stream);  // marks the point after the work enqueued so far on `stream`
  void record();                      // ... on the current stream of the event's device
  void synchronize() const;           // the host waits until the recorded work has finished
  bool query() const;                 // true when the recorded work has finished (or nothing was recorded)
  // Milliseconds between two recorded events of one device; both must have completed (synchronize first).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  friend class detail::OwnedHandle<Event>;
  void release() noexcept;
};

// Makes `stream` the current stream of its device on the calling thread for the guard's scope, then
// restores the previous one. Guards nest; the stream must outlive the guard.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_ = -1;
  void* previous_ = nullptr;
};

// True when the calling thread's current stream on `device` is the legacy default stream (no StreamGuard).
bool default_stream_is_current(int device);

}  // namespace memtrain::cuda

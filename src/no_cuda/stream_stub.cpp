// Streams and events in a build without CUDA: creating one throws "cuda::Stream: memtrain was built
// without CUDA" (or cuda::Event), so no Stream or Event object ever exists and the other members are
// unreachable. The current stream of any device is the default one.
#include "memtrain/cuda/stream.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
constexpr const char* kReason = "memtrain was built without CUDA";
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, kReason); }
}  // namespace

Stream::Stream(int) { not_built("cuda::Stream"); }
Stream::~Stream() = default;
void Stream::release() noexcept {}
void Stream::wait(const Event&) const { not_built("cuda::Stream::wait"); }
void Stream::synchronize() const { not_built("cuda::Stream::synchronize"); }
bool Stream::query() const { not_built("cuda::Stream::query"); }

Event::Event(int) { not_built("cuda::Event"); }
Event::~Event() = default;
void Event::release() noexcept {}
void Event::record(const Stream&) { not_built("cuda::Event::record"); }
void Event::record() { not_built("cuda::Event::record"); }
void Event::synchronize() const { not_built("cuda::Event::synchronize"); }
bool Event::query() const { not_built("cuda::Event::query"); }
float Event::elapsed_ms(const Event&, const Event&) { not_built("cuda::Event::elapsed_ms"); }

StreamGuard::StreamGuard(const Stream&) { not_built("cuda::StreamGuard"); }
StreamGuard::~StreamGuard() = default;

bool default_stream_is_current(int) { return true; }

}  // namespace memtrain::cuda

// dist::Communicator over MPI. Every operation posts nonblocking requests and polls them (wait()) until they
// complete or timeout_seconds() pass, so a dead or stuck peer raises PeerTimeout instead of hanging.
//
// The canonical sums move data point-to-point (rank q receives every rank's part q) and combine the size()
// contributions on the receiving rank with canonical_sum, in rank order, so the bits never depend on arrival
// order or on MPI's reduction algorithm. Messages are cut into chunks of at most chunk_bytes_ (MPI counts are
// ints); the chunks of one (peer, tag) pair arrive in order (MPI's non-overtaking rule).
#include "dist/canonical_sum.h"
#include "dist/collective_checks.h"
#include "dist/mpi_backend.h"
#include "dist/mpi_runtime.h"

#include "core/convert.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace memtrain::dist {
namespace {

// One tag per kind of point-to-point exchange; the operations that use MPI collectives need none.
constexpr int kTagReduceScatter = 11;
constexpr int kTagAllGather = 12;
constexpr int kTagGatherValues = 13;

// Below INT_MAX, so a chunk's byte count fits an MPI count. MEMTRAIN_DIST_CHUNK_BYTES overrides it (tests use
// a few bytes, to send every message in many chunks).
constexpr std::size_t kDefaultChunkBytes = std::size_t{1} << 30;

std::size_t chunk_bytes_from_environment() {
  const char* text = std::getenv("MEMTRAIN_DIST_CHUNK_BYTES");
  if (text == nullptr || *text == '\0') return kDefaultChunkBytes;
  char* end = nullptr;
  const long long bytes = std::strtoll(text, &end, 10);
  MT_CHECK(end != text && *end == '\0' && bytes >= 8 && bytes <= INT_MAX, "dist",
           "MEMTRAIN_DIST_CHUNK_BYTES='{}' is not a byte count from 8 to {}", text, INT_MAX);
  return static_cast<std::size_t>(bytes) / 8 * 8;  // whole elements of every dtype
}

void check_mpi(int rc, std::string_view op, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  ::memtrain::detail::throw_error(op, fmt::format("{} failed: {}", call, std::string_view(text, static_cast<std::size_t>(length))));
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "the other ranks";
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

// The requests of one operation, the peer each waits on (-1 for a collective, where no single peer is known),
// and the storage its buffers live in (kept alive if the operation times out).
struct Requests {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  std::vector<std::shared_ptr<const void>> buffers;

  void add(MPI_Request request, int peer) {
    requests.push_back(request);
    peers.push_back(peer);
  }
};

class MpiCommunicator;

// A send's requests, completed by wait() (or the destructor) under the communicator's lock.
class MpiPendingSend final : public Communicator::PendingSend {
 public:
  MpiPendingSend(MpiCommunicator& comm, int peer) : comm_(comm), peer_(peer) {}
  ~MpiPendingSend() override;
  void wait() override;
  bool test() override;
  Requests requests;

 private:
  MpiCommunicator& comm_;
  int peer_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() : MpiCommunicator(nullptr, 0, 0) {}
  // The ranks of `parent` that pass `color`, ranked by `key`; parent null: all of MPI_COMM_WORLD.
  MpiCommunicator(MpiCommunicator* parent, int color, int key) : chunk_bytes_(chunk_bytes_from_environment()) {
    detail::init_mpi_once();
    if (parent == nullptr) {
      check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "dist::world", "MPI_Comm_dup");
    } else {
      std::lock_guard lock(parent->mutex_);  // an operation of the parent, in its order
      check_mpi(MPI_Comm_split(parent->comm_, color, key, &comm_), "Communicator::split", "MPI_Comm_split");
      set_timeout_seconds(parent->timeout_seconds());
    }
    // Errors come back as return codes, raised as memtrain::Error naming the operation.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Key = world rank, so the rank within the host counts the lower world ranks on the same host.
    MPI_Comm host;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host), "dist::world",
              "MPI_Comm_split_type");
    MPI_Comm_rank(host, &local_rank_);
    MPI_Comm_free(&host);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend() const override { return "mpi"; }
  std::shared_ptr<Communicator> split(int color, int key) override {
    MT_CHECK(color >= 0, "Communicator::split", "color {} must be >= 0", color);
    return std::make_shared<MpiCommunicator>(this, color, key);
  }

  void barrier() override {
    std::lock_guard lock(mutex_);
    Requests r;
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "barrier", "MPI_Ibarrier");
    r.add(request, -1);
    wait("barrier", r);
  }

  void broadcast(Tensor& t, int root) override {
    detail::check_host_tensor("broadcast", t, "the tensor");
    detail::check_root("broadcast", root, size_);
    std::lock_guard lock(mutex_);
    check_same_as_root(t, root);
    Requests r;
    r.buffers.push_back(t.storage());
    post_broadcast(r, t.data_ptr(), t.nbytes(), root, "broadcast");
    wait("broadcast", r);
  }

  std::unique_ptr<PendingSend> send(const Tensor& t, int peer, int tag) override {
    detail::check_host_tensor("send", t, "the tensor");
    detail::check_peer("send", *this, peer, tag);
    std::lock_guard lock(mutex_);
    auto pending = std::make_unique<MpiPendingSend>(*this, peer);
    pending->requests.buffers.push_back(t.storage());
    post_send(pending->requests, t.data_ptr(), t.nbytes(), peer, tag);
    return pending;
  }

  void recv(Tensor& t, int peer, int tag) override {
    detail::check_host_tensor("recv", t, "the tensor");
    detail::check_peer("recv", *this, peer, tag);
    std::lock_guard lock(mutex_);
    Requests r;
    r.buffers.push_back(t.storage());
    post_recv(r, t.data_ptr(), t.nbytes(), peer, tag);
    wait("recv", r);
  }

  std::string broadcast_string(const std::string& s, int root) override {
    detail::check_root("broadcast_string", root, size_);
    std::lock_guard lock(mutex_);
    return broadcast_string_locked(s, root, "broadcast_string");
  }

  std::vector<double> all_gather_f64(const std::vector<double>& mine) override {
    std::lock_guard lock(mutex_);
    return gather_values(mine, "all_gather_f64");
  }
  std::vector<std::int64_t> all_gather_i64(const std::vector<std::int64_t>& mine) override {
    std::lock_guard lock(mutex_);
    return gather_values(mine, "all_gather_i64");
  }

  void all_reduce_sum(Tensor& t) override {
    detail::check_host_tensor("all_reduce_sum", t, "the tensor");
    detail::check_summable("all_reduce_sum", t.dtype());
    std::lock_guard lock(mutex_);
    Requests r;
    if (t.dtype() == DType::f64 || t.dtype() == DType::f32) {
      r.buffers.push_back(t.storage());
      post_all_reduce(r, t.data_ptr(), t.numel(), t.dtype());
      wait("all_reduce_sum", r);
      return;
    }
    // bf16 / f16: summed in f32, rounded once.
    auto sum = std::make_shared<std::vector<float>>(static_cast<std::size_t>(t.numel()));
    r.buffers.push_back(sum);
    ::memtrain::detail::convert(t.data_ptr(), t.dtype(), sum->data(), DType::f32, sum->size());
    post_all_reduce(r, sum->data(), t.numel(), DType::f32);
    wait("all_reduce_sum", r);
    ::memtrain::detail::convert(sum->data(), DType::f32, t.data_ptr(), t.dtype(), sum->size());
  }

  void reduce_scatter_canonical(const Tensor& contribution, const std::vector<std::int64_t>& bounds,
                                Tensor& mine) override {
    constexpr std::string_view op = "reduce_scatter_canonical";
    detail::check_sharded(op, *this, contribution, bounds, mine);
    detail::check_summable(op, contribution.dtype());
    std::lock_guard lock(mutex_);
    const std::size_t esize = contribution.element_size();
    const auto* source = static_cast<const std::byte*>(contribution.data_ptr());
    const std::size_t part_bytes = static_cast<std::size_t>(mine.numel()) * esize;
    // Every other rank's part `rank_`, received into one slot per rank (own slot unused).
    auto received = std::make_shared<std::vector<std::byte>>(part_bytes * static_cast<std::size_t>(size_));
    Requests r;
    r.buffers = {received, contribution.storage()};
    for_each_peer([&](int q) {
      post_recv(r, received->data() + part_bytes * static_cast<std::size_t>(q), part_bytes, q, kTagReduceScatter);
    });
    for_each_peer([&](int q) {
      const auto lo = static_cast<std::size_t>(bounds[static_cast<std::size_t>(q)]);
      const auto hi = static_cast<std::size_t>(bounds[static_cast<std::size_t>(q) + 1]);
      post_send(r, source + lo * esize, (hi - lo) * esize, q, kTagReduceScatter);
    });
    wait(op, r);
    std::vector<const void*> leaves(static_cast<std::size_t>(size_));
    for (int q = 0; q < size_; ++q) {
      leaves[static_cast<std::size_t>(q)] =
          q == rank_ ? source + static_cast<std::size_t>(bounds[static_cast<std::size_t>(rank_)]) * esize
                     : received->data() + part_bytes * static_cast<std::size_t>(q);
    }
    detail::canonical_sum(leaves, contribution.dtype(), mine.numel(), mine.data_ptr());
  }

  void all_gather(const Tensor& mine, const std::vector<std::int64_t>& bounds, Tensor& full) override {
    constexpr std::string_view op = "all_gather";
    detail::check_sharded(op, *this, full, bounds, mine);
    std::lock_guard lock(mutex_);
    const std::size_t esize = full.element_size();
    auto* target = static_cast<std::byte*>(full.data_ptr());
    Requests r;
    r.buffers = {full.storage(), mine.storage()};
    auto part = [&](int q) {
      const auto lo = static_cast<std::size_t>(bounds[static_cast<std::size_t>(q)]);
      const auto hi = static_cast<std::size_t>(bounds[static_cast<std::size_t>(q) + 1]);
      return std::pair{target + lo * esize, (hi - lo) * esize};
    };
    for_each_peer([&](int q) { post_recv(r, part(q).first, part(q).second, q, kTagAllGather); });
    for_each_peer([&](int q) { post_send(r, mine.data_ptr(), mine.nbytes(), q, kTagAllGather); });
    if (mine.nbytes() > 0) std::memmove(part(rank_).first, mine.data_ptr(), mine.nbytes());
    wait(op, r);
  }

 private:
  // fn(q) for every rank q but this one, starting after it (so ranks do not all send to rank 0 first).
  template <typename Fn>
  void for_each_peer(Fn&& fn) const {
    for (int step = 1; step < size_; ++step) fn((rank_ + step) % size_);
  }

  void post_recv(Requests& r, void* data, std::size_t bytes, int peer, int tag) {
    for (std::size_t at = 0; at < bytes; at += chunk_bytes_) {
      MPI_Request request;
      check_mpi(MPI_Irecv(static_cast<std::byte*>(data) + at, static_cast<int>(std::min(chunk_bytes_, bytes - at)),
                          MPI_BYTE, peer, tag, comm_, &request),
                "dist", "MPI_Irecv");
      r.add(request, peer);
    }
  }
  void post_send(Requests& r, const void* data, std::size_t bytes, int peer, int tag) {
    for (std::size_t at = 0; at < bytes; at += chunk_bytes_) {
      MPI_Request request;
      check_mpi(MPI_Isend(static_cast<const std::byte*>(data) + at,
                          static_cast<int>(std::min(chunk_bytes_, bytes - at)), MPI_BYTE, peer, tag, comm_, &request),
                "dist", "MPI_Isend");
      r.add(request, peer);
    }
  }
  void post_broadcast(Requests& r, void* data, std::size_t bytes, int root, std::string_view op) {
    for (std::size_t at = 0; at < bytes; at += chunk_bytes_) {
      MPI_Request request;
      check_mpi(MPI_Ibcast(static_cast<std::byte*>(data) + at, static_cast<int>(std::min(chunk_bytes_, bytes - at)),
                           MPI_BYTE, root, comm_, &request),
                op, "MPI_Ibcast");
      r.add(request, -1);
    }
  }
  void post_all_reduce(Requests& r, void* data, std::int64_t numel, DType dtype) {
    const MPI_Datatype type = dtype == DType::f64 ? MPI_DOUBLE : MPI_FLOAT;
    const auto esize = static_cast<std::int64_t>(dtype_size(dtype));
    const auto chunk = static_cast<std::int64_t>(chunk_bytes_) / esize;
    for (std::int64_t at = 0; at < numel; at += chunk) {
      MPI_Request request;
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, static_cast<std::byte*>(data) + at * esize,
                               static_cast<int>(std::min(chunk, numel - at)), type, MPI_SUM, comm_, &request),
                "all_reduce_sum", "MPI_Iallreduce");
      r.add(request, -1);
    }
  }

  // MpiPendingSend::wait: a send's own requests, under the lock every operation takes.
  friend class MpiPendingSend;
  void wait_send(Requests& r) {
    std::lock_guard lock(mutex_);
    wait("send", r);
  }
  bool test_send(Requests& r) {
    std::lock_guard lock(mutex_);
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(r.requests.size()), r.requests.data(), &done, MPI_STATUSES_IGNORE),
              "send", "MPI_Testall");
    return done != 0;
  }

  // Polls until every request completes; on timeout parks them (mpi_runtime.h) and raises PeerTimeout naming
  // the peers of the requests still open.
  void wait(std::string_view op, Requests& r) {
    detail::reap_parked_requests();
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds());
    std::vector<int> completed(r.requests.size());
    for (long polls = 0;; ++polls) {
      int count = 0;
      check_mpi(MPI_Testsome(static_cast<int>(r.requests.size()), r.requests.data(), &count, completed.data(),
                             MPI_STATUSES_IGNORE),
                op, "MPI_Testsome");
      if (count == MPI_UNDEFINED) return;  // every request done (completed ones become MPI_REQUEST_NULL)
      if (count > 0) continue;
      if (Clock::now() >= deadline) break;
      // Yield first (latency), then sleep (an oversubscribed host, or a long wait, should not burn a core).
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    std::vector<int> silent;
    for (std::size_t i = 0; i < r.requests.size(); ++i) {
      if (r.requests[i] != MPI_REQUEST_NULL && r.peers[i] >= 0) silent.push_back(r.peers[i]);
    }
    std::sort(silent.begin(), silent.end());
    silent.erase(std::unique(silent.begin(), silent.end()), silent.end());
    detail::park_requests(std::move(r.requests), std::move(r.peers), std::move(r.buffers));
    throw PeerTimeout(fmt::format("{}: rank {} of {} waited {:g} s for {} (dead or stuck?)", op, rank_, size_,
                                  timeout_seconds(), rank_list(silent)));
  }

  std::string broadcast_string_locked(const std::string& s, int root, std::string_view op) {
    Requests r;
    auto length = std::make_shared<std::int64_t>(static_cast<std::int64_t>(s.size()));
    r.buffers.push_back(length);
    post_broadcast(r, length.get(), sizeof(std::int64_t), root, op);
    wait(op, r);
    auto text = std::make_shared<std::string>(rank_ == root ? s : std::string(static_cast<std::size_t>(*length), '\0'));
    r = Requests{};
    r.buffers.push_back(text);
    post_broadcast(r, text->data(), text->size(), root, op);
    wait(op, r);
    return *text;
  }

  // Every rank's `bytes` bytes at `mine`, rank by rank (every rank passes the same count).
  std::shared_ptr<std::vector<std::byte>> exchange_equal(const void* mine, std::size_t bytes, std::string_view op) {
    auto all = std::make_shared<std::vector<std::byte>>(bytes * static_cast<std::size_t>(size_));
    auto own = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(mine),
                                                        static_cast<const std::byte*>(mine) + bytes);
    Requests r;
    r.buffers = {all, own};
    for_each_peer([&](int q) {
      post_recv(r, all->data() + bytes * static_cast<std::size_t>(q), bytes, q, kTagGatherValues);
    });
    for_each_peer([&](int q) { post_send(r, own->data(), bytes, q, kTagGatherValues); });
    if (bytes > 0) std::memcpy(all->data() + bytes * static_cast<std::size_t>(rank_), own->data(), bytes);
    wait(op, r);
    return all;
  }

  template <typename T>
  std::vector<T> gather_values(const std::vector<T>& mine, std::string_view op) {
    const auto count = static_cast<std::int64_t>(mine.size());
    const auto counts_bytes = exchange_equal(&count, sizeof count, op);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(size_));
    std::memcpy(counts.data(), counts_bytes->data(), counts_bytes->size());
    for (int q = 0; q < size_; ++q) {
      MT_CHECK(counts[static_cast<std::size_t>(q)] == counts[0], op,
               "every rank must pass the same count, but rank {} passes {} and rank 0 passes {} (counts by rank: {})",
               q, counts[static_cast<std::size_t>(q)], counts[0], fmt::join(counts, ", "));
    }
    const auto all = exchange_equal(mine.data(), mine.size() * sizeof(T), op);
    std::vector<T> values(mine.size() * static_cast<std::size_t>(size_));
    if (!values.empty()) std::memcpy(values.data(), all->data(), all->size());
    return values;
  }

  // Every rank compares its tensor with root's (dtype and shape) and learns which ranks differ, so all of them
  // refuse together instead of some waiting in MPI_Ibcast for the others.
  void check_same_as_root(const Tensor& t, int root) {
    const std::string mine = fmt::format("{} {}", dtype_name(t.dtype()), shape_str(t.shape()));
    const std::string roots = broadcast_string_locked(mine, root, "broadcast");
    const std::vector<std::int64_t> differs =
        gather_values(std::vector<std::int64_t>{mine == roots ? 0 : 1}, "broadcast");
    std::vector<int> ranks;
    for (int q = 0; q < size_; ++q) {
      if (differs[static_cast<std::size_t>(q)] != 0) ranks.push_back(q);
    }
    MT_CHECK(ranks.empty(), "broadcast", "the tensor on {} is unlike root {}'s {} (rank {} has {})",
             rank_list(ranks), root, roots, rank_, mine);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  std::size_t chunk_bytes_;
  std::mutex mutex_;  // one operation at a time: every rank must post them in the same order
};

void MpiPendingSend::wait() {
  if (done_) return;
  done_ = true;  // a timeout parks the requests: they are not waited on twice
  comm_.wait_send(requests);
}

bool MpiPendingSend::test() {
  if (done_) return true;
  done_ = comm_.test_send(requests);
  return done_;
}

MpiPendingSend::~MpiPendingSend() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrain: a send to rank %d did not complete: %s\n", peer_, e.what());
  }
}

}  // namespace

std::shared_ptr<Communicator> detail::make_mpi_world() { return std::make_shared<MpiCommunicator>(); }

}  // namespace memtrain::dist

// The processes of one run and the collectives between them.
//
// A Communicator is a fixed group of `size()` processes, each with its `rank()`. world() is the group the
// launcher started: under `mpirun -np N` it is MPI_COMM_WORLD (MPI is initialised on first use and
// finalised at exit); without a launcher it is a group of one, on which every collective is a copy.
//
// Two kinds of sum:
// - all_reduce_sum: the MPI library's own algorithm (fast; its summation order depends on the world size).
// - the canonical sums (reduce_scatter_canonical, all_reduce_canonical): rank r's contribution is leaf r of
//   one fixed binary tree over the ranks (canonical_split below), evaluated with point-to-point messages in
//   a fixed order, so the result depends only on the contributions, never on arrival order or the library.
//   When each rank's contribution is itself the canonical tree over its own block of 2^k leaves (the
//   trainer's local accumulation), the result equals the canonical tree over all leaves: 1, 2 or 4 ranks give
//   the same bits.
//
// Element types: f64 and f32 are summed in their own type; bf16 and f16 are summed in f32 and rounded once at
// the end. Tensors are contiguous, on the CPU (backends "single", "mpi") or on the rank's GPU ("nccl"); `out`
// tensors are written in place and must have the stated numel and the input's dtype. Every wait is bounded by timeout_seconds(): a peer that does not answer in time (dead,
// or stuck) raises dist::PeerTimeout naming this rank, the peer and the operation, never a hang. After a
// PeerTimeout that operation's outputs are undefined; a peer that joins it late completes it (its messages go
// to the abandoned operation, not to the next one), otherwise end the run with abort_world.
// One collective at a time per communicator: concurrent calls from several threads are serialised.
#pragma once

#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain::dist {

class PeerTimeout : public Error {
 public:
  using Error::Error;
};

// The largest power of two strictly below n (n >= 2): the canonical tree over leaves [lo, lo + n) is
// (tree over [lo, lo + p)) + (tree over [lo + p, lo + n)) with p = canonical_split(n); one leaf is itself.
std::int64_t canonical_split(std::int64_t n);

// Where rank q's part of a flat tensor of `numel` elements begins, for q = 0..world_size (the last entry is
// numel): contiguous parts, every boundary a multiple of `align` (so a rank's part is whole 8-bit blocks),
// as even as that allows, lower ranks taking the extra blocks. A part may be empty.
std::vector<std::int64_t> shard_bounds(std::int64_t numel, std::int64_t world_size, std::int64_t align = 256);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank among the processes on this host (one GPU per local rank).
  virtual int local_rank() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi", "nccl" or "simulated"
  // Where the tensors it sums live: the CPU (single, mpi), the rank's GPU (nccl), meta (simulated).
  virtual Device device() const { return Device::cpu(); }

  double timeout_seconds() const { return timeout_seconds_; }
  void set_timeout_seconds(double s);  // > 0; default 300, or $MEMTRAIN_DIST_TIMEOUT

  virtual void barrier() = 0;
  // root's `t` (any dtype) copied into every rank's `t` (same shape and dtype on all ranks, checked).
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual std::string broadcast_string(const std::string& s, int root) = 0;
  // Every rank's values, rank by rank (each rank passes the same count).
  virtual std::vector<double> all_gather_f64(const std::vector<double>& mine) = 0;
  virtual std::vector<std::int64_t> all_gather_i64(const std::vector<std::int64_t>& mine) = 0;

  // t := sum over ranks of t, by the MPI library's algorithm (in place).
  virtual void all_reduce_sum(Tensor& t) = 0;
  // `contribution` is flat with parts bounds[q]..bounds[q+1] (bounds: size()+1 entries, 0 .. numel, the same
  // on every rank); `mine` (numel bounds[rank+1] - bounds[rank]) := the canonical sum of every rank's part
  // `rank()`. `mine` may be contribution's own part (a view of it): the sum is then made in place.
  virtual void reduce_scatter_canonical(const Tensor& contribution, const std::vector<std::int64_t>& bounds,
                                        Tensor& mine) = 0;
  // full's part q := rank q's `mine`, on every rank (the inverse layout of reduce_scatter_canonical). `mine`
  // may be full's own part.
  virtual void all_gather(const Tensor& mine, const std::vector<std::int64_t>& bounds, Tensor& full) = 0;
  // t := the canonical sum over ranks of t: reduce_scatter_canonical over shard_bounds(numel, size(), 1), then
  // all_gather.
  void all_reduce_canonical(Tensor& t);

  // Sub-groups (the data and tensor dimensions of a 2-D layout): every rank of this group calls it together;
  // the ranks that pass the same `color` form a new group, ranked by `key` (ties by their rank here). The new
  // group has this one's timeout and is independent of it (its collectives never match this group's). Refused by
  // backends without sub-groups (simulated, nccl for now); a group of one returns a group of one.
  virtual std::shared_ptr<Communicator> split(int color, int key);

  // Point to point (pipeline stages). A message is one tensor's bytes; messages from one rank with one tag
  // arrive in the order they were sent. Tags below kFirstUserTag are the collectives' own.
  static constexpr int kFirstUserTag = 100;
  // A send still in flight: wait() returns once its bytes have left `t` (bounded by timeout_seconds()); the
  // destructor waits too (a timeout there is reported on stderr, not thrown).
  class PendingSend {
   public:
    virtual ~PendingSend() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // whether it has completed, without waiting
  };
  // Starts sending `t` (contiguous, where device() says) to rank `peer` and returns at once; t's storage is
  // kept alive until the send completes. Refused by backends without messages (single, nccl for now).
  virtual std::unique_ptr<PendingSend> send(const Tensor& t, int peer, int tag);
  // t := the next message from `peer` with `tag`: blocks until it has arrived (bounded by timeout_seconds()).
  // t must be contiguous and exactly as large as what was sent (a larger message is an error).
  virtual void recv(Tensor& t, int peer, int tag);

 protected:
  Communicator();

 private:
  double timeout_seconds_;
};

// The launcher's ranks as data x model: rank = d * model_ranks + m. `model` holds the ranks that together hold one
// model (its tensor-parallel parts, or its pipeline stages), neighbours as Megatron-LM keeps them on one host;
// `data` the ranks that hold the same part and sum its gradients (dist::attach_data_parallel over it; a group of
// one when world's size is model_ranks). Every rank calls it together; refused when world's size is not a
// multiple of model_ranks.
struct DataModelGroups {
  std::shared_ptr<Communicator> data;
  std::shared_ptr<Communicator> model;
};
DataModelGroups split_data_model(const std::shared_ptr<Communicator>& world, int model_ranks);

// The launcher's group (see above); the same object on every call.
std::shared_ptr<Communicator> world();
// A group of one process (rank 0 of 1), whatever the launcher.
std::shared_ptr<Communicator> single_process();
// Rank `rank` of a group of `size` that does not exist, for predicting one rank's memory on the meta device
// (train::predict_memory, through dist::simulate_rank): the collectives check their arguments and move
// nothing (meta tensors hold no data), value gathers return this rank's values as every rank's (the ranks of
// a prediction are alike), and broadcasts return the caller's own.
std::shared_ptr<Communicator> simulated_group(int rank, int size);
// Whether this build has the MPI backend.
bool mpi_built();
// A new NCCL group over `bootstrap`'s ranks (the launcher's, by default), for CUDA tensors: rank r
// communicates on cuda:<its local rank> (one GPU per rank), rank 0's NCCL id broadcast over `bootstrap`, which
// also carries the host values (all_gather_f64/i64, broadcast_string). Collectives run on the group's own
// stream, ordered after the calling thread's current stream by events and before its later work (no host
// sync); the canonical sums exchange parts point to point and add them on the device in the canonical order,
// with the MPI backend's bits. Every rank calls it together; throws naming the reason when one cannot (no CUDA
// backend, a build without NCCL, no device, more ranks on a host than it has GPUs). Keep the group for the run.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap = world());
// Ends every process of the run with exit status `code`: MPI_Abort when MPI is up (the launcher then stops the
// other ranks, including one stuck in a collective), std::exit otherwise. What a caller does after PeerTimeout.
[[noreturn]] void abort_world(int code);

}  // namespace memtrain::dist

// The backend-independent half of dist::Communicator: the canonical tree and shard layout, the timeout, and
// world(), which picks the MPI backend when a launcher started this process.
#include "memtrain/dist/communicator.h"

#include "core/cuda_module.h"
#include "dist/mpi_backend.h"
#include "dist/nccl_backend.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>

namespace memtrain::dist {

std::int64_t canonical_split(std::int64_t n) {
  MT_CHECK(n >= 2, "canonical_split", "needs n >= 2 leaves, got {}", n);
  return static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(n - 1)));
}

std::vector<std::int64_t> shard_bounds(std::int64_t numel, std::int64_t world_size, std::int64_t align) {
  MT_CHECK(numel >= 0, "shard_bounds", "numel {} is negative", numel);
  MT_CHECK(world_size >= 1, "shard_bounds", "world_size {} is not positive", world_size);
  MT_CHECK(align >= 1, "shard_bounds", "align {} is not positive", align);
  // Whole blocks of `align` elements (the last one may be partial), dealt as evenly as possible.
  const std::int64_t blocks = (numel + align - 1) / align;
  const std::int64_t base = blocks / world_size;
  const std::int64_t extra = blocks % world_size;
  std::vector<std::int64_t> bounds(static_cast<std::size_t>(world_size) + 1);
  for (std::int64_t q = 0; q <= world_size; ++q) {
    const std::int64_t first_block = q * base + std::min(q, extra);
    bounds[static_cast<std::size_t>(q)] = std::min(numel, first_block * align);
  }
  return bounds;
}

namespace {

constexpr double kDefaultTimeoutSeconds = 300;

double timeout_from_environment() {
  const char* text = std::getenv("MEMTRAIN_DIST_TIMEOUT");
  if (text == nullptr || *text == '\0') return kDefaultTimeoutSeconds;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  MT_CHECK(end != text && *end == '\0' && seconds > 0, "dist",
           "MEMTRAIN_DIST_TIMEOUT='{}' is not a number of seconds > 0", text);
  return seconds;
}

// The number of processes a launcher says it started, from the variables Open MPI (OMPI_COMM_WORLD_SIZE) and
// MPICH/Hydra or Slurm's PMI (PMI_SIZE) set; 0 when neither is set.
long launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::strtol(value, nullptr, 10);
  }
  return 0;
}

[[maybe_unused]] bool started_by_launcher() { return launcher_world_size() > 0 || std::getenv("PMIX_RANK") != nullptr; }

std::shared_ptr<Communicator> make_world() {
#if MEMTRAIN_HAVE_MPI
  if (started_by_launcher()) return detail::make_mpi_world();
#else
  const long launched = launcher_world_size();
  MT_CHECK(launched <= 1, "dist::world",
           "a launcher started {} processes, but this build of memtrain has no MPI (install libopenmpi-dev and "
           "reconfigure with MEMTRAIN_MPI=ON); each process would train alone",
           launched);
#endif
  return single_process();
}

}  // namespace

Communicator::Communicator() : timeout_seconds_(timeout_from_environment()) {}

void Communicator::set_timeout_seconds(double s) {
  MT_CHECK(s > 0, "Communicator::set_timeout_seconds", "timeout {} s is not > 0", s);
  timeout_seconds_ = s;
}

void Communicator::all_reduce_canonical(Tensor& t) {
  MT_CHECK(t.defined(), "all_reduce_canonical", "the tensor is undefined");
  const std::vector<std::int64_t> bounds = shard_bounds(t.numel(), size(), 1);
  const auto me = static_cast<std::size_t>(rank());
  Tensor mine = Tensor::empty({bounds[me + 1] - bounds[me]}, t.dtype(), t.device());
  reduce_scatter_canonical(t, bounds, mine);
  all_gather(mine, bounds, t);
}

DataModelGroups split_data_model(const std::shared_ptr<Communicator>& world, int model_ranks) {
  MT_CHECK(world != nullptr && model_ranks >= 1 && world->size() % model_ranks == 0, "dist::split_data_model",
           "{} ranks cannot be split into models of {} ranks each", world ? world->size() : 0, model_ranks);
  if (world->size() == model_ranks) return {single_process(), world};
  const int d = world->rank() / model_ranks, m = world->rank() % model_ranks;
  DataModelGroups groups;
  groups.model = world->split(d, m);
  groups.data = world->split(m, d);
  return groups;
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  MT_CHECK(false, "Communicator::split", "the '{}' backend makes no sub-groups (color {}, key {})", backend(), color,
           key);
  return nullptr;
}

std::unique_ptr<Communicator::PendingSend> Communicator::send(const Tensor&, int peer, int tag) {
  MT_CHECK(false, "Communicator::send", "the '{}' backend sends no point-to-point messages (to rank {}, tag {})",
           backend(), peer, tag);
  return nullptr;
}

void Communicator::recv(Tensor&, int peer, int tag) {
  MT_CHECK(false, "Communicator::recv", "the '{}' backend receives no point-to-point messages (from rank {}, tag {})",
           backend(), peer, tag);
}

std::shared_ptr<Communicator> world() {
  // A function-local static: built once, thread-safely; a failed build throws and is retried by the next call.
  static const std::shared_ptr<Communicator> the_world = make_world();
  return the_world;
}

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> bootstrap) {
  const char* where = "dist::make_nccl_communicator";
  MT_CHECK(bootstrap != nullptr, where, "the bootstrap group is null");
  std::string why;
  void* symbol = ::memtrain::detail::cuda_module_symbol(detail::kNcclGroupSymbol, why);
  MT_CHECK(symbol != nullptr, where, "no CUDA backend: {}", why);
  const auto* entry = reinterpret_cast<const detail::NcclGroupEntry* (*)()>(symbol)();
  std::shared_ptr<Communicator> made = entry->make(std::move(bootstrap), why);
  MT_CHECK(made != nullptr, where, "{}", why);
  return made;
}

bool mpi_built() {
#if MEMTRAIN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void abort_world(int code) {
#if MEMTRAIN_HAVE_MPI
  detail::abort_mpi_if_running(code);
#endif
  std::exit(code);
}

}  // namespace memtrain::dist

// GaLore projector (Zhao et al. 2024): keeps a rank-r orthonormal basis of one side of an m x n gradient G,
// refreshed from G's top-r singular vectors every `update_gap` steps, and maps between the full and the
// projected space:
//   left  (P: m x r):        R = P^T G   (r x n),   back: scale * P N
//   right (Q: n x r):        R = G Q     (m x r),   back: scale * N Q^T
//   full  (P and Q):         R = P^T G Q (r x r),   back: scale * P N Q^T
// `std` projects the smaller side (m <= n -> left, else right), `reverse_std` the larger one. Note: the
// reference implementation sends a square G to the right side; here m == n goes left (same bytes, same
// quality, the subspaces differ).
// Refresh rule (as the reference): the first project() call, and every call with step % update_gap == 0.
// SVD: exact (Eigen::BDCSVD) or randomized range finder (Halko et al.): Y = A Omega, q power iterations
// with QR re-orthonormalisation, B = Q^T A, small SVD of B, P = Q U_B[:, :r]. With warm_start, the range
// search starts from [previous P | Gaussian columns] (pushed once through A A^T) instead of A Omega.
// Canonical signs: right after each decomposition every basis column gets a sign fixed by a rule, not by the
// SVD library: a first basis has each column's largest-magnitude entry positive (the lowest row on a tie);
// a later one has each column's dot product with the previous basis's same column >= 0. The base state of a
// projected weight outlives a refresh in the basis's coordinates, so without the rule a column whose sign the
// library flipped would mix old and new state with the wrong sign, and the CPU (Eigen), the GPU (cuSOLVER) and
// PyTorch (LAPACK) would drift apart after the first refresh. A restored projector aligns its next refresh to
// the stored basis, so checkpoints written before the rule still load.
// Random numbers come from the projector's own Philox stream (seed, offset), not the global one, so a run
// is reproducible whatever else draws random numbers. f32, 2-D, contiguous or not.
// Devices: the first project() fixes the device (CPU, CUDA or meta: any with a backend, whose galore_*
// entries do the linear algebra); the basis lives there and every later tensor must be on it. On meta the
// basis reads as zeros (no data to decompose) while the tensors and the random stream follow the CPU's. On CUDA the same algorithm runs with cuBLAS / cuSOLVER (Householder QR, Jacobi SVD) on the
// same Gaussian draws (made on the host from the same Philox stream, so rng_state() advances identically):
// the basis equals the CPU's up to f32 rounding, the canonical signs above included.
#pragma once

#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace memtrain::optim {

enum class GaLoreProjType { std_side, reverse_std_side, left, right, full };
enum class GaLoreSvd { exact, randomized };
// When a projected weight's decoupled weight decay applies (galore.h): before the update (memtrain's order, as
// torch.optim.AdamW) or after it (Hugging Face's AdamW, and so galore_torch).
enum class GaLoreDecayOrder { before, after };

const char* galore_proj_type_name(GaLoreProjType t);  // "std", "reverse_std", "left", "right", "full"
const char* galore_svd_name(GaLoreSvd s);             // "exact", "randomized"
const char* galore_decay_order_name(GaLoreDecayOrder o);  // "before", "after"
GaLoreDecayOrder galore_decay_order_from_name(std::string_view name);  // throws naming both
// The inverses; throw memtrain::Error naming the known values.
GaLoreProjType galore_proj_type_from_name(std::string_view name);
GaLoreSvd galore_svd_from_name(std::string_view name);

// The canonical signs (above) on a fresh basis (rows x r, row-major f32, any device), in place: against
// `previous` (the same side's last basis, same shape) when it is defined, else the first-basis rule.
void apply_canonical_signs(Tensor& basis, const Tensor& previous);

struct GaLoreProjectorOptions {
  std::int64_t rank = 128;
  std::int64_t update_gap = 200;
  double scale = 0.25;
  GaLoreProjType proj_type = GaLoreProjType::std_side;
  GaLoreSvd svd = GaLoreSvd::randomized;
  int power_iterations = 2;   // randomized only
  int oversample = 8;         // randomized only: the range search keeps rank + oversample columns
  bool warm_start = true;     // randomized only: start from the previous basis
  std::uint64_t seed = 0x6a10'5eed;
  // GaLore's, not the projector's (GaLoreSpec is this struct): see GaLoreDecayOrder.
  GaLoreDecayOrder decay_order = GaLoreDecayOrder::before;
};

class GaLoreProjector {
 public:
  // Which basis the projector keeps, fixed at the first project() from G's shape and proj_type.
  enum class Side { unset, left, right, both };

  explicit GaLoreProjector(GaLoreProjectorOptions options);

  // G: (m, n) f32, the same shape and device at every call. Refreshes the basis when due (see the top), then
  // returns the projected gradient: (r, n) left, (m, r) right, (r, r) full.
  Tensor project(const Tensor& G, std::int64_t step);
  // acc += the projection of G on the current basis, never refreshing (accumulating micro-batches of one
  // step: project() has seen the step's first one). G and acc as for project(); acc contiguous.
  void project_add(const Tensor& G, Tensor& acc) const;
  // N: the projected shape above, on the projector's device. Returns scale * (P N | N Q^T | P N Q^T), shape
  // (m, n), f32.
  Tensor project_back(const Tensor& N) const;
  // W = W * decay + project_back(N) for W (m, n) contiguous f32 on the projector's device (on CUDA one gemm
  // with beta = decay, no (m, n) temporary).
  void project_back_add(const Tensor& N, Tensor& W, float decay) const;

  bool refreshed_last() const { return refreshed_last_; }  // whether the last project() refreshed
  std::int64_t refresh_count() const { return refresh_count_; }
  Side side() const { return side_; }
  const Tensor& matrix() const { return side_ == Side::right ? right_ : left_; }  // P, or Q for right
  const Tensor& left_matrix() const { return left_; }    // P (m, r); undefined unless left / both
  const Tensor& right_matrix() const { return right_; }  // Q (n, r); undefined unless right / both
  std::size_t bytes() const;  // bytes of the basis matrices: 4*min(m,n)*r for std, 0 before the first call
  Device device() const { return device_; }  // where the basis lives (CPU until the first project())
  const GaLoreProjectorOptions& options() const { return options_; }

  // The side an (m, n) gradient gets under `proj_type`, and the shape of its projection at rank r.
  static Side side_for(GaLoreProjType proj_type, std::int64_t m, std::int64_t n);
  static Shape projected_shape(Side side, std::int64_t m, std::int64_t n, std::int64_t r);

  // Checkpoints: the Philox position, and restore() of everything later project() calls depend on (shape,
  // basis, random stream, refresh count), so a restored projector continues bit-identically. `left` is
  // (m, r) for the left / both sides, `right` (n, r) for right / both; the unused one is undefined. The basis
  // is copied to `device`, which later gradients must be on.
  const RngState& rng_state() const { return rng_; }
  void restore(std::int64_t m, std::int64_t n, const Tensor& left, const Tensor& right, RngState rng,
               std::int64_t refresh_count, Device device = Device::cpu());

 private:
  void init_shape(std::int64_t m, std::int64_t n, Device device);
  void check_same_device(const Tensor& t, const char* what) const;
  // out = (or +=, when accumulate) the projection of contiguous G on the current basis.
  void project_into(const Tensor& G, Tensor& out, bool accumulate) const;
  void refresh(const Tensor& G);
  // N checked against the projected shape and the device, made contiguous; `who` names the caller.
  Tensor checked_projected(const Tensor& N, const char* who) const;
  // W = scale * (P N | N Q^T | P N Q^T), plus W * decay when accumulating (the backend's galore_project_back).
  void project_back_into(const Tensor& N, Tensor& W, bool accumulate, float decay) const;

  GaLoreProjectorOptions options_;
  Device device_ = Device::cpu();
  Side side_ = Side::unset;
  std::int64_t m_ = 0, n_ = 0;
  Tensor left_, right_;
  RngState rng_;
  bool refreshed_last_ = false;
  std::int64_t refresh_count_ = 0;
};

}  // namespace memtrain::optim

// Fitting a run into a memory budget: fit_to_budget() searches the memory techniques jointly — precision,
// optimizer-state precision (32-bit or 8-bit), GaLore, activation checkpointing, the split of the global batch
// into micro-batch x accumulation, layer-wise updates, and for a data-parallel run the ZeRO stage — predicts each
// candidate on the meta device
// (predict.h: memory exact to the byte on the CPU) and picks the one a cost model says is fastest among those
// whose predicted peak fits — among those without GaLore when any of them fits, since GaLore changes what is
// learned (a low-rank update) where the other knobs change only precision, memory and time. Nothing is trained
// to decide.
//
// Two knobs rank before speed, as GaLore does: bf16 weights (without an f32 master, every update is rounded) are
// taken only when nothing with f32 weights fits. The checkpoint budget policy is not enumerated: once the search
// is done, the best few fitting candidates that recompute are tried again with budget:X, X the largest
// activation budget that still fits (bisection on predictions), which recomputes only what the budget has no
// room for.
//
// Search: candidates are visited fastest-looking first. A candidate is skipped without a prediction when
//   - one that needs no more memory in every monotone knob (8-bit <= 32-bit state, layer-wise on <= off,
//     full <= every:2, selective <= none checkpointing, a smaller micro-batch) was predicted over the budget
//     (precision and GaLore are not monotone: bf16's compute copies of weights, GaLore's projectors);
//   - or one of its own state knobs (precision, state, GaLore, layer-wise) that is no slower in every
//     activation knob (less recompute, a larger micro-batch) was predicted to fit.
// A prediction stops at the first allocation past the budget (the meta allocator's budget), so a candidate
// that does not fit costs little.
//
// Cost model: a step's seconds = f32 FLOPs / f32 GEMM rate + bf16 FLOPs / bf16 GEMM rate + (bytes the step
// allocates + bytes the optimizer streams) / memory bandwidth, with the work counted on meta (StepWork) and
// the three rates measured on this machine by CostModel::calibrate() (a fraction of a second). State in files
// adds its bytes / the rate of mapping and releasing them (calibrate_offload, on the offload directory). A data-parallel
// candidate adds the bytes its collectives send (counted by the simulated group) / communicated_bytes_per_second.
//
// Data parallel (world_size > 1): every rank of a candidate is predicted (RunInputs::prepare_rank), since shards
// are uneven; it fits when every rank does, its peak is the largest rank's and its step time the slowest rank's.
// The ZeRO stage is not taken as monotone: a higher stage shards more but adds gather and bucket buffers. The
// search is deterministic given the cost model, so ranks that share one (calibrated on rank 0 and broadcast)
// choose the same configuration. Candidates the configuration check refuses (e.g. layer-wise GaLore across
// ranks, an accumulation that is not a power of two) are reported with the reason and never predicted.
#pragma once

#include "memtrain/train/predict.h"
#include "memtrain/train/trainer_config.h"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace memtrain::train {

struct CostModel {
  double f32_flops_per_second = 0.0;
  double narrow_flops_per_second = 0.0;  // bf16
  double bytes_per_second = 0.0;         // of an elementwise add, counted as its result's bytes
  // Of the collectives, by the bytes a rank sends. calibrate() sets it to bytes_per_second: MPI between the
  // processes of one host copies through shared memory. Between hosts, set the network's rate.
  double communicated_bytes_per_second = 0.0;
  // Optimizer state in files (offload_optimizer file:DIR): what mapping each slice of state before it is stepped
  // and handing its pages back after costs, by the state bytes of tensors mapped in 4 KiB pages and of those
  // mapped in 2 MiB folios (core/file_arena.h). 0 until calibrate_offload() measures them.
  double offload_small_bytes_per_second = 0.0;
  double offload_huge_bytes_per_second = 0.0;
  double calibration_seconds = 0.0;
  // Throws when the work has state in files and the offload rates are not measured.
  double step_seconds(const StepWork& work) const;
  std::string describe() const;  // the rates, and how long calibrating took
  // Times a GEMM in f32 and in bf16 (768 x 768 x 2048) and an elementwise add over 16 Mi floats on the CPU.
  static CostModel calibrate();
  // Times mapping and handing back the pages of state tensors in files under `dir` (64 of 256 KiB, one of
  // 32 MiB), as a step does once their pages are in the page cache.
  void calibrate_offload(const std::string& dir);
};

// Which knobs the search may change; a knob held fixed keeps the base configuration's value.
struct FitKnobs {
  bool precision = true;        // fp32, bf16
  bool optimizer_state = true;  // 32-bit or 8-bit state of the base's family (adamw, lion); others stay
  bool galore = true;           // off, or rank galore_rank (when 0: a quarter of the smallest projected dim)
  bool checkpointing = true;    // none, selective, every:2, full
  bool accumulation = true;     // micro-batch halved down to 1, accumulation doubled: the same global batch
  bool layerwise = true;        // off, on
  bool zero = true;             // ZeRO 0, 1, 2 (only when world_size > 1)
  bool param_dtype = true;      // f32 masters, or bf16 weights (under bf16 / fp8 compute, on one rank)
  // Non-empty: the optimizer state may go to files under this directory (offload_optimizer "file:DIR"). Empty:
  // the base configuration's offload stays as it is.
  std::string offload_dir;
};

struct FitCandidate {
  TrainerConfig config;
  std::string knobs;  // "bf16, adamw8bit, selective, micro-batch 2 x 4, layer-wise"
  bool predicted = false;  // false: skipped (see note)
  bool fits = false;
  std::size_t peak_bytes = 0;  // the predicted peak (of its largest rank); for one stopped at the budget, the budget
  std::int64_t largest_rank = 0;  // data parallel: the rank whose peak that is
  double step_seconds = 0.0;   // the cost model's, for one that fits
  std::string note;            // why it was skipped
};

struct FitResult {
  std::size_t budget_bytes = 0;
  std::optional<TrainerConfig> chosen;  // the fastest that fits (its memory_budget_bytes set to the budget)
  std::optional<MemoryPrediction> chosen_prediction;
  std::vector<FitCandidate> candidates;  // every candidate weighed, in the order visited
  std::optional<std::size_t> chosen_index;  // of the chosen one in candidates
  // When nothing fits: the smallest prediction among the candidates that save the most memory (every
  // monotone knob at its smallest), made without the budget so its whole breakdown is known.
  std::optional<MemoryPrediction> smallest;
  std::string smallest_knobs;
  CostModel cost_model;
  double seconds = 0.0;
  // The candidates predicted (fits?, peak, step time), then the choice, or the refusal with the smallest
  // predicted breakdown and the category that dominates it.
  std::string report() const;
};

// Searches the knobs around `base` for the fastest configuration whose predicted peak is at most budget_bytes.
// The cost model is calibrated unless one is given. Throws what predict_memory throws for a bad base.
FitResult fit_to_budget(const TrainerConfig& base, std::size_t budget_bytes, const RunInputs& inputs,
                        const FitKnobs& knobs = {}, std::optional<CostModel> cost_model = std::nullopt);

}  // namespace memtrain::train

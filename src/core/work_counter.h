// What a step costs in work, counted where the work would be done: the meta backend adds each kernel entry's
// arithmetic (matmul-family FLOPs, by the precision of its operands) and the bytes the optimizer steps stream,
// to the counter a caller installed on its thread (train::predict_memory, around one training step). The
// memory traffic of everything else is the bytes the step allocates (MemoryStats::allocated_bytes), which
// the caller reads from the allocator. A simulated data-parallel rank (dist::simulated_group) adds the bytes
// its collectives would move. A cost model turns the counts into seconds (train/fit.h).
#pragma once

#include "memtrain/core/scoped_thread_value.h"

namespace memtrain::detail {

struct WorkCounts {
  double flops_f32 = 0.0;     // products in f32 or f64 (fp8's emulated GEMMs included: they run in f32)
  double flops_narrow = 0.0;  // products in bf16 or f16
  double optimizer_bytes = 0.0;  // bytes the optimizer steps read and write (parameters, gradients, state)
  double communicated_bytes = 0.0;  // bytes this rank's collectives send to the other ranks

  WorkCounts& operator+=(const WorkCounts& o) {
    flops_f32 += o.flops_f32;
    flops_narrow += o.flops_narrow;
    optimizer_bytes += o.optimizer_bytes;
    communicated_bytes += o.communicated_bytes;
    return *this;
  }
};

// The counter of this thread, nullptr when none is installed (counting is then skipped).
WorkCounts* current_work_counter();

// Installs `counter` (not owned) on this thread until the guard ends, then puts back the one it replaced.
class WorkCounterGuard : public ScopedThreadValue<WorkCounts*> {
 public:
  explicit WorkCounterGuard(WorkCounts* counter);
};

}  // namespace memtrain::detail

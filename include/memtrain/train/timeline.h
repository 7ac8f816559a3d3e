// The memory timeline of a training step: every allocation and free of one device's allocator, as the live
// bytes of each category after it, with the step's phases marked (the Trainer marks them: forward, backward,
// optimizer step, eval, checkpoint save). memory_timeline_svg() draws it as a stacked area chart, with the
// total of a predicted timeline (the same step on the meta device, train::predict_memory) as a dashed line.
//
// The x axis is the event count, not wall time: the CPU and meta runs of one step allocate in the same order,
// so their curves line up, and a short burst of allocations is as visible as a long kernel.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"

#include <array>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace memtrain::train {

class MemoryTimeline {
 public:
  using Live = std::array<std::size_t, kNumMemoryCategories>;
  struct Phase {
    std::string name;
    std::size_t first_sample = 0;  // the phase starts at this sample
  };

  // Starts recording `device`'s allocator (one recorder per allocator at a time: it replaces another's).
  explicit MemoryTimeline(Device device);
  ~MemoryTimeline();  // stops
  MemoryTimeline(const MemoryTimeline&) = delete;
  MemoryTimeline& operator=(const MemoryTimeline&) = delete;

  void stop();
  bool recording() const { return recording_; }
  void mark(std::string phase);  // from the next sample on

  Device device() const { return device_; }
  // Read once recording has stopped (or while no other thread allocates on the device).
  const std::vector<Live>& samples() const { return samples_; }
  const std::vector<Phase>& phases() const { return phases_; }
  std::size_t peak_total() const;  // the largest sum over categories of one sample

 private:
  Device device_;
  bool recording_ = true;
  mutable std::mutex mutex_;  // samples come from every thread that allocates (the loaders' too)
  std::vector<Live> samples_;
  std::vector<Phase> phases_;
};

// A self-contained SVG (no scripts, no external files): the stacked live bytes of each category over the
// measured samples, axes in MiB, a legend by category, each phase as a labelled vertical line, and the total
// of `predicted` (may be null) dashed on top. More than 1200 samples are thinned to the one with the largest
// total in each of 1200 buckets, so the peak is always drawn.
std::string memory_timeline_svg(const MemoryTimeline& measured, const MemoryTimeline* predicted,
                                const std::string& title);
// Writes it to path atomically.
void write_memory_timeline_svg(const MemoryTimeline& measured, const MemoryTimeline* predicted,
                               const std::string& title, const std::string& path);

}  // namespace memtrain::train

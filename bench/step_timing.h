// Helpers shared by the whole-step benchmarks (bench_gpt_e2e, bench_ckpt_round_robin): CPU time, peak RSS,
// medians and random token batches.
#pragma once

#include "memtrain/core/tensor.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace memtrain::bench {

// CPU seconds (user + system, all threads) this process has used: next to wall time, it shows how much
// of a step was lost to other processes on a busy machine.
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Peak resident set size of this process in KiB (VmHWM), or 0 where /proc is absent.
inline std::int64_t peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

inline double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::mt19937_64& gen) {
  std::vector<std::int64_t> buf(static_cast<std::size_t>(B * T));
  std::uniform_int_distribution<std::int64_t> dist(0, V - 1);
  for (auto& t : buf) t = dist(gen);
  return from_buffer(buf.data(), {B, T}, DType::i64, DType::i64);
}

}  // namespace memtrain::bench

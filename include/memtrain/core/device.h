// Where a tensor's bytes live.
#pragma once

#include <fmt/format.h>

#include <string>

namespace memtrain {

enum class DeviceType : unsigned char { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index); }
};

}  // namespace memtrain

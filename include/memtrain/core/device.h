// Where a tensor's bytes live. `meta` holds none: a meta tensor has a shape, a dtype and storage that the
// meta allocator accounts to the byte, and every op runs on it without executing a kernel (src/meta/).
#pragma once

#include <fmt/format.h>

#include <string>

namespace memtrain {

enum class DeviceType : unsigned char { cpu, cuda, meta };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  static Device meta() { return {DeviceType::meta, 0}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  bool operator==(const Device&) const = default;
  // "cpu", "meta", or the kind and index of an accelerator ("cuda:1").
  std::string str() const {
    switch (type) {
      case DeviceType::cpu: return "cpu";
      case DeviceType::meta: return "meta";
      case DeviceType::cuda: break;
    }
    return fmt::format("cuda:{}", index);
  }
};

}  // namespace memtrain

// Where a tensor lives: host memory (CPU backend) or one CUDA device.
#pragma once
#include <string>

namespace megadlm {

enum class DeviceType : uint8_t { Cpu, Cuda };

struct Device {
  DeviceType type = DeviceType::Cpu;
  int index = 0;  ///< CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::Cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::Cuda, index}; }
  bool is_cpu() const { return type == DeviceType::Cpu; }
  bool is_cuda() const { return type == DeviceType::Cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

/// True when this library was built with the CUDA backend.
bool cuda_compiled();
/// Number of visible CUDA devices (0 when built without CUDA or when no GPU is present).
int cuda_device_count();

}  // namespace megadlm

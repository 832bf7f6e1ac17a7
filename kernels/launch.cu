// Host side of the launch helpers in common.cuh.
#include <mutex>

#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {

DeviceCaps device_caps(int device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static DeviceCaps caps[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return DeviceCaps{};
  std::call_once(once[device], [device] {
    DeviceCaps c;
    if (cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device) !=
            cudaSuccess) {
      cudaGetLastError();  // a failed query must not surface in a later launch's check
      c = DeviceCaps{};
    }
    caps[device] = c;
  });
  return caps[device];
}

int code_arch(const void* func) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, func) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not surface in a later launch's check
    return 0;
  }
  return attr.binaryVersion < attr.ptxVersion ? attr.binaryVersion : attr.ptxVersion;
}

bool pdl_enabled() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return device_caps(device).major >= 9;
}

}  // namespace kernels
}  // namespace warpformer

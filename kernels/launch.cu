// Host side of the launch helpers in common.cuh.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {

bool pdl_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("WARPFORMER_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static int major[kMaxDevices] = {};  // 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (major[device] == 0) {
    if (cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device) !=
        cudaSuccess) {
      cudaGetLastError();
      major[device] = -1;
    }
  }
  return major[device] >= 9;
}

}  // namespace kernels
}  // namespace warpformer

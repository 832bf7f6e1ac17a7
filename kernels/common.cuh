// Device-side helpers shared by the kernel families: float conversion for the three element
// types, 16-byte vector access, warp/block reductions and the runtime-to-template switches the
// launchers use. Included only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace warpformer {
namespace kernels {

// ---- element conversion (all arithmetic happens in fp32)
// -----------------------------------------
template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- vectors ------------------------------------------------------------------------------------
// N elements of T moved as one aligned access (N * sizeof(T) is 16 bytes on the fast path).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ src, float (&dst)[N]) {
  const Vec<T, N> tmp = *reinterpret_cast<const Vec<T, N>*>(src);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = to_float(tmp.v[i]);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* __restrict__ dst, const float (&src)[N]) {
  Vec<T, N> tmp;
#pragma unroll
  for (int i = 0; i < N; ++i) tmp.v[i] = from_float<T>(src[i]);
  *reinterpret_cast<Vec<T, N>*>(dst) = tmp;
}

// True when every pointer is aligned to `bytes` (null pointers count as aligned).
__host__ __forceinline__ bool aligned_to(const void* p, int bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}

// The shared-state-space address of a pointer into this block's shared memory (what PTX
// instructions on .shared operands take).
__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- reductions -------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds 32 floats. Safe to call
// repeatedly with the same scratch (the leading barrier protects the previous call's readers).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = (lane < nwarps) ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// Both components of v summed over the warp, by the same xor tree as warp_sum.
__device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, off);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
  }
  return v;
}

// Two block sums for the price of one: the same tree as block_sum for each component (so either
// sum has block_sum's bits), with one pair of barriers. `scratch` holds 32 float2.
__device__ __forceinline__ float2 block_sum2(float2 v, float2* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum2(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum2((lane < nwarps) ? scratch[lane] : make_float2(0.f, 0.f));
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- launches -----------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90): a kernel started with launch_kernel() may be scheduled
// before the kernel ahead of it on the stream has finished, which hides the launch gap between
// the short kernels of a decode step. Such a kernel must call wait_for_prior_kernels() before
// its first global memory access that could touch what earlier kernels write; the wait returns
// once the previous kernel has completed and its writes are visible. Reads of data that no
// kernel in flight writes (model weights) may come before it: that is how the GEMV starts
// streaming its weight while the kernel ahead of it is still running. Without a programmatic
// launch, or before sm_90, the wait is a no-op.
__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled now rather than when this one's blocks exit
// (it then runs up to its own wait_for_prior_kernels() while this one is still running). Called
// after the wait, it overlaps at most two kernels of a stream: when a kernel starts, every kernel
// before the one just ahead has completed (the fused decode attention reads the cache before its
// wait on that promise of the QKV product ahead of it). The one exception is a GEMV launched
// beside the kernel ahead (GemvParams::beside): it calls this at once and waits only before it
// exits, so the kernel after it may start while the one before it still runs. Used where the
// next kernel is meant to be a GEMV, whose weight loads then overlap this kernel: the norms and
// the decode attention (and its split-KV combine) at 1-2 rows, and the GEMV itself (whatever
// follows it).
// Not meant for kernels ahead of cuBLASLt products: there an early start slowed the batch-1 prefill
// (benchmarks/HISTORY.md, "Batch-64 prefill: where the other 45% goes"). (Where the gemm ops'
// 'cublaslt' backend follows a 1-2-row norm, the norm still starts it early; that costs speed,
// never correctness.)
__device__ __forceinline__ void start_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Rows up to which the [k, n] products of a layer run on the GEMV (kGemvPreferredRowsKN in
// kernels/gemv.h; kernels/gemv.cu asserts that the two agree).
constexpr int kEarlyStartRows = 2;

// SM count and compute capability major of a device, queried once per process (kernels/launch.cu);
// zeros for a device that cannot be queried.
struct DeviceCaps {
  int sms = 0;
  int major = 0;
};
DeviceCaps device_caps(int device);

// The architecture (10 * major + minor) that the loaded code of kernel `func` was compiled for,
// for the current device: the lower of the binary's and the PTX's, since code JIT-compiled from
// older PTX reports the device's binary version but holds only what that PTX's __CUDA_ARCH__
// kept (so on a machine mixing architectures a feature can only be switched off where it would
// work, never on where not). 0 when the query fails. Callers ask once and keep the answer.
int code_arch(const void* func);

// True when launch_kernel() asks for programmatic dependent launch: the current device is sm_90
// or newer (kernels/launch.cu); older GPUs launch plainly.
bool pdl_enabled();

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  unsigned cluster_y = 1;  // thread-block cluster of (1, cluster_y, 1) blocks when > 1
};

// Launches `kernel` (which must begin with wait_for_prior_kernels()) with the shape's grid,
// block, dynamic shared memory and cluster, programmatically dependent when pdl_enabled().
template <typename... Params, typename... Args>
cudaError_t launch_kernel(const LaunchShape& shape, cudaStream_t stream, void (*kernel)(Params...),
                          Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (shape.cluster_y > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = shape.cluster_y;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace kernels
}  // namespace warpformer

// Turn a runtime bool into a compile-time constant named CONST inside the body.
#define WF_BOOL_SWITCH(COND, CONST, ...) \
  [&] {                                  \
    if (COND) {                          \
      constexpr bool CONST = true;       \
      return __VA_ARGS__();              \
    } else {                             \
      constexpr bool CONST = false;      \
      return __VA_ARGS__();              \
    }                                    \
  }()

// Device-side helpers shared by the kernel families: float conversion for the three element
// types, 16-byte vector access, warp/block reductions and the runtime-to-template switches the
// launchers use. Included only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// ---- element conversion (all arithmetic happens in fp32) -----------------------------------------
template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
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

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

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

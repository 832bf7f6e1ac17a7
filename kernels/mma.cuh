// Tensor-core helpers (sm_80+) for 16-bit operands with fp32 accumulation: mma.sync m16n8k16,
// ldmatrix loads of 8 x 8 tiles from shared memory and the asynchronous copies that fill it. Which
// elements of a tile each lane holds is given in the PTX ISA, "Matrix fragments for mma.m16n8k16":
// for lane (g, q) = (lane / 4, lane % 4), an "a" register pair holds row g (or g + 8), columns 2q,
// 2q + 1 (or + 8); "b" holds column g, rows 2q, 2q + 1 (or + 8); the accumulator holds rows g and g
// + 8, columns 2q, 2q + 1. Device code built for an older architecture traps; launchers check the
// device first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {

// d += a . b for a 16 x 16 tile a (4 registers of two T each), a 16 x 8 tile b (2 registers) and
// a 16 x 8 fp32 accumulator d.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "tensor-core products take fp16 or bf16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();
#endif
}

// Four 8 x 8 tiles of 16-bit values from shared memory: lanes 8i .. 8i + 7 give the addresses of
// tile i's rows (16 bytes each), and r[i] receives lane (g, q)'s part of tile i: row g, columns
// 2q and 2q + 1 (kTrans: column g, rows 2q and 2q + 1, i.e. the tile transposed).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t addr = shared_addr(row);
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#else
  __trap();
#endif
}

// Asynchronous copies global -> shared (sm_80+), grouped per thread: cp_async_commit() closes a
// group, cp_async_wait<N>() returns once at most N of the thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_addr(dst)), "l"(src)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Two values rounded to T in one register, `lo` in the low half (the lower column or k).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace kernels
}  // namespace warpformer

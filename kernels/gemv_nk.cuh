// The GEMV for [n, k] weights (the lm_head), included by gemv.cu, which launches it.
//
// Each warp owns two output columns and reads their weight rows as 512-byte coalesced runs; a
// warp-sum gives the dot products. From kMmaMinRows rows on (16-bit types) the products run on
// tensor cores instead (gemv_nk_mma_kernel), where the CUDA-core FMAs per weight element, not the
// weight stream, would set the pace.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_common.cuh"
#include "kernels/mma.cuh"

namespace warpformer {
namespace kernels {
namespace gemv_impl {

constexpr int kRowsPerWarp = 2;  // output columns per warp of gemv_nk_kernel
// The [n, k] tensor-core kernel: the rows from which it runs (16-bit types; at 1-2 rows the
// CUDA-core kernel streams as fast), its block size, the mma tiles of 16 output columns per warp
// and the 32-wide k chunks each thread loads per step.
constexpr int kMmaMinRows = 3;
constexpr int kNkMmaThreads = 128;
constexpr int kNkMmaTiles = 2;
constexpr int kNkMmaUnroll = 4;

template <typename T, int M>
__global__ void __launch_bounds__(kThreads) gemv_nk_kernel(const GemvParams<T> p) {
  constexpr int V = 16 / sizeof(T);
  wait_for_prior_kernels();
  start_next_kernel();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  if (row0 >= p.n) return;  // warp-uniform

  const T* w[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    // A row past the end re-reads the first one; its result is never stored.
    w[r] = p.weight + static_cast<int64_t>(row0 + r < p.n ? row0 + r : row0) * p.k;
  }
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  }
#pragma unroll 4
  for (int k0 = lane * V; k0 < p.k; k0 += 32 * V) {
    int4 wv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wv[r] = load_stream(w[r] + k0);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float x[V];
      load_vec<T, V>(p.in + static_cast<int64_t>(m) * p.k + k0, x);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const T* wr = reinterpret_cast<const T*>(&wv[r]);
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < V; ++e) d = fmaf(x[e], to_float(wr[e]), d);
        acc[r][m] += d;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == r * M + m && row0 + r < p.n) {
        const int64_t idx = static_cast<int64_t>(m) * p.n + row0 + r;
        p.out[idx] = from_float<T>(finish(v, p, idx, row0 + r));
      }
    }
  }
}

// [n, k] weights, 16-bit T, up to 8 rows, on tensor cores: out^T [n, m] = W [n, k] . in^T, the
// weight rows as the mma's 16 x 16 "a" tiles and the input rows as its 16 x 8 "b" tile (rows
// m..7 zero). A warp owns kNkMmaTiles x 16 weight rows and the whole k, so no reduction
// follows. Lane (g, q) = (lane / 4, lane % 4) loads, per 32-wide chunk of k, 16 contiguous bytes
// at k = chunk + 8q of weight rows g and g + 8 of each tile and of input row g. A product is a
// sum over k, so any one-to-one placement of k in the mma's 16 positions is right as long as
// the weight and the input use the same one: the lane's halves 0-3 take the positions
// {2q, 2q+1, 2q+8, 2q+9} of the chunk's first mma, halves 4-7 those of its second, which is what
// keeps every load one coalesced 16-byte vector. The accumulator of a tile then holds
// out[2q, 2q+1][weight rows g, g + 8]. Fixed order: deterministic.
template <typename T, int M>
__global__ void __launch_bounds__(kNkMmaThreads) gemv_nk_mma_kernel(const GemvParams<T> p) {
  static_assert(M <= 8 && sizeof(T) == 2, "8 input rows of 16-bit values at most");
  constexpr int V = 8;
  constexpr int kChunk = 32;
  constexpr int kRows = kNkMmaTiles * 16;  // weight rows per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int row0 = (blockIdx.x * (kNkMmaThreads / 32) + warp) * kRows;
  const bool live = row0 < p.n;  // warp-uniform; a dead warp still waits and starts the next
  const T* w[kNkMmaTiles][2];
#pragma unroll
  for (int t = 0; t < kNkMmaTiles; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // A row past the end re-reads the last one; its result is never stored.
      const int r = min(row0 + t * 16 + h * 8 + g, p.n - 1);
      w[t][h] = p.weight + static_cast<int64_t>(r) * p.k + V * q;
    }
  }
  const T* x = p.in + static_cast<int64_t>(g < M ? g : 0) * p.k + V * q;
  float acc[kNkMmaTiles][4];
#pragma unroll
  for (int t = 0; t < kNkMmaTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
  }
  const int4 zero = make_int4(0, 0, 0, 0);
  // One step of kNkMmaUnroll chunks: every weight load of the step is issued before its first mma,
  // so a lane has 16 x 16 bytes in flight. FULL: the whole step lies inside k, and the loads carry
  // no range test. (With a test on every load, ptxas sank each load to just before its mma, leaving
  // 4 in flight, and the 8-row lm_head streamed well below the copy bandwidth:
  // benchmarks/HISTORY.md, "bench_lambada.py" and "Figures moved from code comments (issue 50)".)
  auto step = [&](int c0, auto full_tag) {
    constexpr bool full = decltype(full_tag)::value;
    int4 wv[kNkMmaUnroll][kNkMmaTiles][2];
#pragma unroll
    for (int u = 0; u < kNkMmaUnroll; ++u) {
      const int kk = c0 + u * kChunk;  // this lane's k is kk + 8q: in range or the chunk is out
#pragma unroll
      for (int t = 0; t < kNkMmaTiles; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wv[u][t][h] = full || kk + V * q < p.k ? load_stream(w[t][h] + kk) : zero;
        }
      }
    }
    __syncwarp();  // keeps ptxas from sinking the loads above into the mma sequence below
#pragma unroll
    for (int u = 0; u < kNkMmaUnroll; ++u) {
      const int kk = c0 + u * kChunk;
      const int4 xv =
          g < M && (full || kk + V * q < p.k) ? *reinterpret_cast<const int4*>(x + kk) : zero;
#pragma unroll
      for (int t = 0; t < kNkMmaTiles; ++t) {
        const int4 lo = wv[u][t][0], hi = wv[u][t][1];
        mma_16816<T>(acc[t], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
        mma_16816<T>(acc[t], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
      }
    }
  };
  // No weight loads before the wait: at 3+ rows the kernel ahead (the final norm) does not
  // start this one early, so there is nothing to overlap.
  wait_for_prior_kernels();
  start_next_kernel();
  if (!live) return;
  constexpr int kStep = kNkMmaUnroll * kChunk;
  int c0 = 0;
  for (; c0 + kStep <= p.k; c0 += kStep) step(c0, std::true_type{});
  if (c0 < p.k) step(c0, std::false_type{});
#pragma unroll
  for (int t = 0; t < kNkMmaTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 2 * q + (i & 1);
      const int col = row0 + t * 16 + g + (i >> 1) * 8;
      if (m < M && col < p.n) {
        const int64_t idx = static_cast<int64_t>(m) * p.n + col;
        p.out[idx] = from_float<T>(finish(acc[t][i], p, idx, col));
      }
    }
  }
}

}  // namespace gemv_impl
}  // namespace kernels
}  // namespace warpformer

// The [k, n] GEMV of 3-8 rows of 16-bit values on tensor cores, included by gemv.cu, which
// launches it (launch_gemv, launch_gemv_normed) where kn_mma_eligible holds.
//
// A block owns 64 output columns and a chunk of k (kn_mma_split): it copies its [kchunk, 64]
// weight tile into shared memory with cp.async, before waiting for the kernel ahead when the
// weight is static (GemvParams::prefetch_weight), so the whole tile streams while that kernel
// finishes. Then it takes its slice of the <= 8 input rows (normalised by the block itself for
// launch_gemv_normed, as the CUDA-core kernel does) and runs mma.sync m16n8k16 with the weight
// tile as the transposed "a" operand (ldmatrix.trans: 16 output columns x 16 k) and the input
// rows as "b" (8 rows: the mma's n, no padded tile). Its 8 warps are 4 column tiles x 2 halves of
// the chunk; the halves add in shared memory, and the k-split's blocks (a thread-block cluster
// of up to 8) push their sums into rank 0's shared memory (st.async), which adds them in rank
// order and applies the epilogue. Sums in a fixed order: deterministic, and the plain and the
// normalising launch give the same bits for the same normalised rows.
//
// At 8 rows it beats cuBLASLt on gpt2-medium / bloom-560m's four layer products in a chain of
// calls (benchmarks/HISTORY.md, "The [k, n] GEMV of 3-8 rows on tensor cores"), which is where
// the weight-before-wait pays: a whole tile is in flight before the kernel ahead ends. Weights
// past kKnMmaMaxWeightBytes stay on cuBLASLt, where that overlap matters less and its tiles
// stream well.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cluster.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_common.cuh"
#include "kernels/mma.cuh"

namespace warpformer {
namespace kernels {
namespace gemv_impl {

constexpr int kKnMmaCols = 64;                       // output columns per block
constexpr int kKnMmaRowBytes = kKnMmaCols * 2 + 16;  // a staged weight row, padded so that the 8
                                                     // rows an ldmatrix reads hit 8 bank groups
constexpr int kKnMmaMaxChunk = 1024;                 // k rows per block at most
constexpr int kKnMmaMinChunk = 256;
constexpr int kKnMmaMaxSplit = 8;                     // portable cluster size
constexpr int kKnMmaMinBlocks = 32;                   // fewer blocks: halve the chunk (down to 256)
constexpr int kKnMmaOut = kKnMmaCols * kGemvMaxRows;  // a block's sums
constexpr size_t kKnMmaMaxWeightBytes = size_t(16) << 20;

struct KnMmaSplit {
  int tiles = 0, ksplit = 0, kchunk = 0;
};

// Column tiles and k chunks of a [k, n] product: the largest chunk of 256, 512 or 1,024 rows that
// divides k, halved while the grid has fewer than kKnMmaMinBlocks blocks and the split stays within
// a cluster. (For the 1,024-wide models' layer products this picks the chunk that the staged-tile
// probe timed best per shape: benchmarks/HISTORY.md, "Figures moved from code comments
// (issue 50)".)
inline KnMmaSplit kn_mma_split(int n, int k) {
  KnMmaSplit s;
  s.tiles = n / kKnMmaCols;
  s.kchunk = kKnMmaMaxChunk;
  while (s.kchunk > kKnMmaMinChunk && k % s.kchunk != 0) s.kchunk /= 2;
  while (s.kchunk > kKnMmaMinChunk && s.tiles * (k / s.kchunk) < kKnMmaMinBlocks &&
         k / (s.kchunk / 2) <= kKnMmaMaxSplit) {
    s.kchunk /= 2;
  }
  s.ksplit = k / s.kchunk;
  return s;
}

// Dynamic shared memory: the weight tile, the input rows [8][kchunk + 8] (padded like the tile),
// the second half's sums and, on rank 0, the other ranks' sums.
constexpr size_t kn_mma_smem(const KnMmaSplit& s) {
  return static_cast<size_t>(s.kchunk) * kKnMmaRowBytes +
         static_cast<size_t>(kGemvMaxRows) * (s.kchunk + 8) * 2 +
         static_cast<size_t>(s.ksplit) * kKnMmaOut * sizeof(float);
}

// M: the rows the normalising prologue forms (NORM); the plain kernel is instantiated once with
// M = kGemvMaxRows and reads p.m of them. `ksplit` blocks of a (1, ksplit, 1) cluster share a
// column tile; blockIdx.y is the rank.
template <typename T, int M, bool NORM>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_kn_mma_kernel(const GemvParams<T> p, int ksplit, int kchunk, const GemvNorm<T> g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "tensor-core products take 16-bit values");
  constexpr int V = 8;  // elements per 16 bytes
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t gather_bar;
  unsigned char* wt = smem;
  const int xstride = kchunk + 8;
  T* xs = reinterpret_cast<T*>(smem + static_cast<size_t>(kchunk) * kKnMmaRowBytes);
  float* half_sums = reinterpret_cast<float*>(xs + kGemvMaxRows * xstride);
  float* gathered = half_sums + kKnMmaOut;  // [ksplit - 1][kKnMmaOut], rank 0
  const int rank = static_cast<int>(blockIdx.y);
  if (ksplit > 1) {
    if (rank == 0 && threadIdx.x == 0) {
      init_tx_barrier(&gather_bar, static_cast<uint32_t>((ksplit - 1) * kKnMmaOut * sizeof(float)));
    }
    cluster_arrive_relaxed();
  }
  const int n0 = static_cast<int>(blockIdx.x) * kKnMmaCols;
  const int kbeg = rank * kchunk;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // 1. The weight tile [kchunk][64], 16 bytes per cp.async.
  auto stage_weight = [&] {
    constexpr int kPerRow = kKnMmaCols / V;
    for (int c = tid; c < kchunk * kPerRow; c += kThreads) {
      const int r = c / kPerRow, j = c % kPerRow;
      cp_async16(wt + r * kKnMmaRowBytes + j * 16,
                 p.weight + static_cast<int64_t>(kbeg + r) * p.n + n0 + j * V);
    }
    cp_async_commit();
  };
  if (p.prefetch_weight) stage_weight();
  if constexpr (NORM) {
    if (p.prefetch_weight) {  // the norm weights are static too: ask L1 for them now
      for (int kk = kbeg + tid * V; kk < kbeg + kchunk; kk += kThreads * V) {
        prefetch_l1(g.norm.gamma + kk);
        if (g.norm.beta != nullptr) prefetch_l1(g.norm.beta + kk);
      }
    }
  }
  wait_for_prior_kernels();
  start_next_kernel();
  if (!p.prefetch_weight) stage_weight();

  // 2. The input rows [8][kchunk] (rows past p.m are zeros; their outputs are not stored).
  const int rows = NORM ? M : p.m;
  if constexpr (NORM) {
    normalize_input<T, M>(g, g.norm.gamma, g.norm.beta, p.k, kbeg, kbeg + kchunk, xstride, xs);
  } else {
    for (int c = tid; c < rows * (kchunk / V); c += kThreads) {
      const int r = c / (kchunk / V), j = c % (kchunk / V);
      *reinterpret_cast<int4*>(xs + r * xstride + j * V) =
          *reinterpret_cast<const int4*>(p.in + static_cast<int64_t>(r) * p.k + kbeg + j * V);
    }
  }
  for (int c = tid; c < (kGemvMaxRows - rows) * (kchunk / V); c += kThreads) {
    const int r = rows + c / (kchunk / V), j = c % (kchunk / V);
    *reinterpret_cast<int4*>(xs + r * xstride + j * V) = make_int4(0, 0, 0, 0);
  }
  cp_async_wait<0>();
  __syncthreads();

  // 3. Warp (tile, half): output columns tile * 16.., k rows of its half of the chunk.
  const int tile = warp % 4, half = warp / 4;
  const int li = lane / 8, lj = lane % 8;  // ldmatrix: lanes 8i..8i+7 give tile i's row addresses
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const int kh = kchunk / 2;
#pragma unroll 4
  for (int ks = half * kh; ks < (half + 1) * kh; ks += 32) {
    // b: the 8 input rows at k ks.. ks + 31, as four 8 x 8 tiles (k 0-7, 8-15, 16-23, 24-31).
    uint32_t b[4];
    ldmatrix_x4<false>(b, xs + lj * xstride + ks + li * 8);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      // a: the weight tile's 16 k x 16 columns, transposed. Its registers are (columns 0-7,
      // k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): stored tiles at k + 8 * (i / 2),
      // columns + 8 * (i % 2).
      uint32_t a[4];
      const int krow = ks + 16 * s + lj + 8 * (li / 2);
      ldmatrix_x4<true>(a, wt + krow * kKnMmaRowBytes + (tile * 16 + 8 * (li % 2)) * 2);
      mma_16816<T>(d, a[0], a[1], a[2], a[3], b[2 * s], b[2 * s + 1]);
    }
  }
  // d[0], d[1]: column tile * 16 + lane / 4, rows 2 (lane % 4) and + 1; d[2], d[3]: column + 8.
  // The block's sums are laid out by (tile, lane, register): the same thread of every rank holds
  // the same outputs.
  const int slot = (tile * 32 + lane) * 4;
  if (half == 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) half_sums[slot + j] = d[j];
  }
  __syncthreads();
  if (half == 1) {
    if (ksplit > 1) cluster_wait();
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) d[j] += half_sums[slot + j];
  if (ksplit > 1) {
    cluster_wait();  // rank 0's barrier is initialised (and every block has started)
    if (rank != 0) {
      const uint32_t bar = cluster_rank_addr(shared_addr(&gather_bar), 0);
      const uint32_t dst = cluster_rank_addr(shared_addr(gathered + (rank - 1) * kKnMmaOut), 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        store_to_rank(dst + (slot + j) * static_cast<uint32_t>(sizeof(float)), d[j], bar);
      }
      return;
    }
    wait_tx_barrier(&gather_bar);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v = 0.f;
      v += d[j];  // from 0: a -0 sum stores +0, as the CUDA-core kernel's
      for (int r = 1; r < ksplit; ++r) v += gathered[(r - 1) * kKnMmaOut + slot + j];
      d[j] = v;
    }
  }
  const int c0 = n0 + tile * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int m = 2 * (lane % 4) + (j & 1), cc = c0 + 8 * (j >> 1);
    if (m < p.m) {
      const int64_t idx = static_cast<int64_t>(m) * p.n + cc;
      p.out[idx] = from_float<T>(finish(d[j], p, idx, cc));
    }
  }
#else
  __trap();  // launchers run it only on sm_90 code (kn_mma_eligible)
#endif
}

}  // namespace gemv_impl
}  // namespace kernels
}  // namespace warpformer

// The GEMV over weight-only quantized weights (gemv.h, "weight-only quantized weights") and their
// dequantization for many-row products.
//
// The product runs on tensor cores (mma.sync m16n8k16, fp32 accumulation) for 1 to 8 rows: the
// weight is the mma's "a" (16 output columns x 16 input rows), the input rows its "b" (8 columns,
// rows past p.m zero). Packed bytes become "a" registers of exact small integers in 16-bit form
// with two or three integer/half instructions per pair of weights, so the dequantization costs
// about the same at 8 rows as at one (the CUDA-core design spent an FMA per weight and row).
//
// A block owns 128 output columns, 8 chunks of 16 (lane group g = lane / 4 streams chunk g), and a
// range of stored rows split evenly over its 8 warps (contiguous, so an int4 group's scale is
// applied once per group to a warp's partial sums). Each warp step covers 16 input rows: lane
// (g, q) loads the 16-byte vectors of its chunk in the stored rows the mma fragment needs (int4:
// rows q and 4 + q, each byte holding input rows 2r and 2r + 1 of one column; int8: rows 2q, 2q +
// 1, 8 + 2q, 9 + 2q) and the two input pairs of its "b" registers. The loads go into a ring of
// registers a few steps ahead, so the weight stream does not stall on the arithmetic. (A ring in
// shared memory filled by cp.async spent most of its time in the memory-instruction queue:
// benchmarks/HISTORY.md, "the quantized GEMV's ring in registers".)
//
// fp16: a byte or nibble placed in the mantissa of 1024 (0x64xx) reads 1024 + value exactly, and
// one half2 subtraction leaves the integer (a byte permute, a lop3 and the subtraction per pair).
// bf16 has too few mantissa bits for bytes and goes through fp32 (2^23 + value), then packs. Sums
// are reduced over the warps in shared memory and over a k-split's blocks (sm_90 clusters) through
// rank 0, in rank order, so results are deterministic run to run.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/cluster.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_common.cuh"
#include "kernels/mma.cuh"

namespace warpformer {
namespace kernels {

using namespace gemv_impl;  // NOLINT(build/namespaces): the GEMV family's shared pieces

namespace {

constexpr int kTileCols = 128;       // a block's output columns
constexpr int kChunkCols = 16;       // a lane group's columns: one 16-byte vector of packed bytes
constexpr int kVecCols = 16;         // columns of one 16-byte vector (the dequantize kernel's unit)
constexpr int kMaxSplit = 8;         // portable cluster size
constexpr float kMagic = 8388608.f;  // 2^23: a byte b in its mantissa reads 2^23 + b

// Per format: 16-byte weight vectors a thread loads per warp step and stored rows per warp step
// (16 input rows). The register ring holds kStages steps (fewer with zero points): as many as
// fit beside the accumulators within the 128 registers of two blocks an SM.
template <int BITS>
struct QuantStep {
  static constexpr int kVecs = BITS == 8 ? 4 : 2;
  static constexpr int kRows = BITS == 8 ? 16 : 8;
  static constexpr int kStages = 3;
};

// 2^23 + byte J of w.
template <int J>
__device__ __forceinline__ float byte_float(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | J));
}

// Sixteen values of T (scales) from 16-column-aligned memory, as floats.
template <typename T>
__device__ __forceinline__ void load16(const T* src, float (&dst)[kVecCols]) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll
  for (int h = 0; h < kVecCols / V; ++h) {
    float part[V];
    load_vec<T, V>(src + h * V, part);
#pragma unroll
    for (int e = 0; e < V; ++e) dst[h * V + e] = part[e];
  }
}

__device__ __forceinline__ uint32_t half2_bits(__half2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ __half2 bits_half2(uint32_t v) {
  return *reinterpret_cast<const __half2*>(&v);
}

// (a & b) ^ c in one instruction (the compiler splits it into two).
__device__ __forceinline__ uint32_t and_xor(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// An "a" register of int8 weights: byte P of w0 (input row k) and of w1 (row k + 1), one column.
// fp16: (1024 + (q ^ 0x80)) - 1152 = q; bf16: through fp32.
template <typename T, int P>
__device__ __forceinline__ uint32_t int8_pair(uint32_t w0, uint32_t w1) {
  if constexpr (std::is_same_v<T, __half>) {
    const uint32_t t = __byte_perm(w0, w1, P | ((4 + P) << 8));
    const uint32_t r = and_xor(t, 0x00FF00FFu, 0x64806480u);
    return half2_bits(__hadd2(bits_half2(r), bits_half2(0xE480E480u)));  // - (1024 + 128)
  } else {
    const float lo = byte_float<P>(w0 ^ 0x80808080u) - (kMagic + 128.f);
    const float hi = byte_float<P>(w1 ^ 0x80808080u) - (kMagic + 128.f);
    return pack2<T>(lo, hi);
  }
}

// An "a" register of int4 weights: byte P of w holds input rows 2r (bits 0-3) and 2r + 1 (bits
// 4-7) of one column; w4 is w >> 4. Symmetric nibbles have their sign bit flipped (q + 8 in
// 0..15); `add_h` is the half2 -(1024 + z) twice (z = 8 when symmetric) and `add_f` 2^23 + z.
template <typename T, bool ZERO, int P>
__device__ __forceinline__ uint32_t int4_pair(uint32_t w, uint32_t w4, uint32_t add_h,
                                              float add_f) {
  if constexpr (std::is_same_v<T, __half>) {
    const uint32_t t = __byte_perm(w, w4, P | ((4 + P) << 8));  // lo nibble, then hi nibble
    const uint32_t r = and_xor(t, 0x000F000Fu, ZERO ? 0x64006400u : 0x64086408u);
    return half2_bits(__hadd2(bits_half2(r), bits_half2(add_h)));
  } else {
    const uint32_t b = ((ZERO ? w : w ^ 0x88888888u) >> (8 * P)) & 0xFFu;
    const float lo = __uint_as_float(0x4B000000u | (b & 0xFu)) - add_f;
    const float hi = __uint_as_float(0x4B000000u | (b >> 4)) - add_f;
    return pack2<T>(lo, hi);
  }
}

// M: the output rows the block reduces (p.m rounded up to 1, 2, 4 or 8; the mma always forms 8).
// `ksplit` blocks of a (1, ksplit, 1) cluster share a column tile; blockIdx.y is the rank, and
// `kchunk` (a multiple of 8 warp steps) its stored rows.
template <typename T, int M, int BITS, bool ZERO>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_quant_kernel(const GemvParams<T> p, const GemvQuant<T> q, int ksplit, int kchunk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using S = QuantStep<BITS>;
  // Zero points take 32 registers more (add_h, add_f): two stages keep them from spilling.
  constexpr int V = S::kVecs, D = ZERO ? 2 : S::kStages;
  constexpr int kOut = M * kTileCols;
  // Dynamic: the warps' sums [kWarps][kOut], and on rank 0 of a k-split the other ranks' sums
  // [ksplit - 1][kOut].
  extern __shared__ __align__(16) unsigned char smem[];
  float* const gathered = reinterpret_cast<float*>(smem + kWarps * kOut * sizeof(float));
  __shared__ __align__(8) uint64_t gather_bar;
  kn_split_begin<kOut>(ksplit, &gather_bar);

  const int n = p.n, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const int rows = BITS == 8 ? p.k : p.k / 2;  // stored rows
  const int chunk = blockIdx.x * kTileCols + g * kChunkCols;
  const bool col_ok = chunk < n, row_ok = g < p.m;
  const int wchunk = kchunk / kWarps;
  const int wbeg = min(rows, blockIdx.y * kchunk + warp * wchunk);
  const int steps = (min(rows, min(blockIdx.y * kchunk + kchunk, wbeg + wchunk)) - wbeg) / S::kRows;
  const uint8_t* const data = static_cast<const uint8_t*>(q.data);

  // This thread's source addresses at step 0 and their advance per step (zero for a lane past
  // the columns or rows, which loads nothing and uses zeros).
  const int64_t wstep = col_ok ? static_cast<int64_t>(S::kRows) * n : 0;
  const int xstep = row_ok ? 16 : 0;
  const uint8_t* const wsrc =
      col_ok ? data + static_cast<int64_t>(wbeg + (BITS == 8 ? 2 * qd : qd)) * n + chunk : data;
  const T* const xsrc =
      row_ok ? p.in + static_cast<int64_t>(g) * p.k + wbeg * (BITS == 8 ? 1 : 2) + 2 * qd : p.in;
  int voff[V];  // byte offset of vector v's stored row
#pragma unroll
  for (int v = 0; v < V; ++v)
    voff[v] = col_ok ? (BITS == 8 ? (v >> 1) * 8 + (v & 1) : v * 4) * n : 0;
  // The ring: D steps of weight vectors and input pairs, indexed by constants (the loop below is
  // unrolled by D), so it stays in registers.
  int4 wreg[D][V];
  uint32_t xreg[D][2];
  // Each weight byte is read once per call: streamed (evict-first) past L1.
  auto load_weights = [&](const uint8_t* src, int slot) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      wreg[slot][v] = col_ok ? load_stream(src + voff[v]) : make_int4(0, 0, 0, 0);
    }
  };
  auto load_inputs = [&](const T* src, int slot) {
    xreg[slot][0] = row_ok ? __ldg(reinterpret_cast<const uint32_t*>(src)) : 0u;
    xreg[slot][1] = row_ok ? __ldg(reinterpret_cast<const uint32_t*>(src + 8)) : 0u;
  };

  // Weights are static: the first stages' loads go out before the wait for the kernel ahead.
  if (p.prefetch_weight) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      if (st < steps) load_weights(wsrc + st * wstep, st);
    }
  }
  wait_for_prior_kernels();
  start_next_kernel();
#pragma unroll
  for (int st = 0; st < D; ++st) {
    if (st < steps) {
      if (!p.prefetch_weight) load_weights(wsrc + st * wstep, st);
      load_inputs(xsrc + st * xstep, st);
    }
  }

  // acc[j]: mma j's outputs, columns chunk + 2j (d0, d1) and + 1 (d2, d3), rows 2q and 2q + 1.
  // int4 accumulates a group in part[] and adds it scaled.
  constexpr int kParts = BITS == 4 ? 8 : 1;
  float acc[8][4], part[kParts][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < kParts; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) part[j][e] = 0.f;
  }
  uint32_t add_h[ZERO ? kChunkCols : 1];
  float add_f[ZERO ? kChunkCols : 1];
  add_h[0] = 0xE408E408u;  // -1032 twice
  add_f[0] = kMagic + 8.f;
  int group = -1;
  auto flush = [&]() {  // acc += part * the group's scales
    if (group < 0) return;
    float sc[kChunkCols];
    if (col_ok) {
      load16(q.scale + static_cast<int64_t>(group) * n + chunk, sc);
    } else {
#pragma unroll
      for (int e = 0; e < kChunkCols; ++e) sc[e] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < kParts; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[j][e] = fmaf(part[j][e], sc[2 * j + (e >> 1)], acc[j][e]);
        part[j][e] = 0.f;
      }
    }
  };

  const uint8_t* wnext = wsrc + D * wstep;
  const T* xnext = xsrc + D * xstep;
  int group_end = 0;  // int4: the input row where the current group ends
  // Unrolled by the ring's depth, so that each slot's registers are indexed by constants.
  for (int st0 = 0; st0 < steps; st0 += D) {
#pragma unroll
    for (int slot = 0; slot < D; ++slot) {
      const int st = st0 + slot;
      if (st >= steps) break;
      int4 wv[V];
#pragma unroll
      for (int v = 0; v < V; ++v) wv[v] = wreg[slot][v];
      const uint32_t b0 = xreg[slot][0], b1 = xreg[slot][1];
      if constexpr (BITS == 4) {
        const int k0 = 2 * (wbeg + st * S::kRows);
        if (k0 >= group_end) {  // warp-uniform: a new group's scales (and zero points)
          flush();
          group = k0 / q.group;
          group_end = (group + 1) * q.group;
          if constexpr (ZERO) {
            uint32_t zw[4] = {0u, 0u, 0u, 0u};
            if (col_ok) {
              const int4 z =
                  *reinterpret_cast<const int4*>(q.zero + static_cast<int64_t>(group) * n + chunk);
              zw[0] = z.x, zw[1] = z.y, zw[2] = z.z, zw[3] = z.w;
            }
#pragma unroll
            for (int e = 0; e < kChunkCols; ++e) {
              const uint32_t z = (zw[e / 4] >> (8 * (e % 4))) & 0xFFu;
              add_h[e] = (0xE400u | z) * 0x10001u;  // -(1024 + z) twice
              add_f[e] = kMagic + static_cast<float>(z);
            }
          }
        }
      }
      const uint32_t* w = reinterpret_cast<const uint32_t*>(wv);  // [V][4] words
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t a[4];
        // Byte 2j of a vector is column chunk + 2j: word j / 2, byte (2j) % 4; 2j + 1 the next.
        if constexpr (BITS == 8) {
          if (j % 2 == 0) {
            a[0] = int8_pair<T, 0>(w[0 * 4 + j / 2], w[1 * 4 + j / 2]);
            a[1] = int8_pair<T, 1>(w[0 * 4 + j / 2], w[1 * 4 + j / 2]);
            a[2] = int8_pair<T, 0>(w[2 * 4 + j / 2], w[3 * 4 + j / 2]);
            a[3] = int8_pair<T, 1>(w[2 * 4 + j / 2], w[3 * 4 + j / 2]);
          } else {
            a[0] = int8_pair<T, 2>(w[0 * 4 + j / 2], w[1 * 4 + j / 2]);
            a[1] = int8_pair<T, 3>(w[0 * 4 + j / 2], w[1 * 4 + j / 2]);
            a[2] = int8_pair<T, 2>(w[2 * 4 + j / 2], w[3 * 4 + j / 2]);
            a[3] = int8_pair<T, 3>(w[2 * 4 + j / 2], w[3 * 4 + j / 2]);
          }
          mma_16816<T>(acc[j], a[0], a[1], a[2], a[3], b0, b1);
        } else {
          const int e0 = ZERO ? 2 * j : 0, e1 = ZERO ? 2 * j + 1 : 0;
          const uint32_t v0 = w[j / 2], v1 = w[4 + j / 2], v04 = v0 >> 4, v14 = v1 >> 4;
          if (j % 2 == 0) {
            a[0] = int4_pair<T, ZERO, 0>(v0, v04, add_h[e0], add_f[e0]);
            a[1] = int4_pair<T, ZERO, 1>(v0, v04, add_h[e1], add_f[e1]);
            a[2] = int4_pair<T, ZERO, 0>(v1, v14, add_h[e0], add_f[e0]);
            a[3] = int4_pair<T, ZERO, 1>(v1, v14, add_h[e1], add_f[e1]);
          } else {
            a[0] = int4_pair<T, ZERO, 2>(v0, v04, add_h[e0], add_f[e0]);
            a[1] = int4_pair<T, ZERO, 3>(v0, v04, add_h[e1], add_f[e1]);
            a[2] = int4_pair<T, ZERO, 2>(v1, v14, add_h[e0], add_f[e0]);
            a[3] = int4_pair<T, ZERO, 3>(v1, v14, add_h[e1], add_f[e1]);
          }
          mma_16816<T>(part[j % kParts], a[0], a[1], a[2], a[3], b0, b1);
        }
      }
      // The slot's registers are consumed (copied out above): refill it D steps ahead.
      if (st + D < steps) {
        load_weights(wnext, slot);
        load_inputs(xnext, slot);
      }
      wnext += wstep;
      xnext += xstep;
    }
  }
  if constexpr (BITS == 4) flush();

  float (&red)[kWarps][kOut] = *reinterpret_cast<float (*)[kWarps][kOut]>(smem);
  // Rows 2q and 2q + 1 as float4s of four adjacent columns, the 4-column groups of a 16-column
  // chunk XORed with q so that each quarter-warp's stores hit distinct banks (rows are 128
  // words apart; nothing changes at 1-2 rows, where only q = 0 stores).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = g * kChunkCols + 4 * (i ^ qd);
    if (2 * qd < M) {
      *reinterpret_cast<float4*>(&red[warp][(2 * qd) * kTileCols + col]) =
          make_float4(acc[2 * i][0], acc[2 * i][2], acc[2 * i + 1][0], acc[2 * i + 1][2]);
    }
    if (2 * qd + 1 < M) {
      *reinterpret_cast<float4*>(&red[warp][(2 * qd + 1) * kTileCols + col]) =
          make_float4(acc[2 * i][1], acc[2 * i][3], acc[2 * i + 1][1], acc[2 * i + 1][3]);
    }
  }
  __syncthreads();
  const int col0 = blockIdx.x * kTileCols;
  kn_store_sums(red, ksplit, &gather_bar, gathered, [&](int i, float v) {
    const int m = i / kTileCols, s = i % kTileCols;
    const int cc = col0 + ((s & ~12) | ((((s >> 2) & 3) ^ ((m >> 1) & 3)) << 2));
    if (m < p.m && cc < n) {
      if constexpr (BITS == 8) v *= to_float(q.scale[cc]);
      const int64_t idx = static_cast<int64_t>(m) * n + cc;
      p.out[idx] = from_float<T>(finish(v, p, idx, cc));
    }
  });
#else
  __trap();  // launchers run it only on sm_80+ code (gemv_quant_supported)
#endif
}

// out[r', c .. c + 15] for one 16-byte vector of stored row r (int4: input rows 2r and 2r + 1).
template <typename T, int BITS, bool ZERO>
__global__ void dequantize_kernel(const GemvQuant<T> q, int k, int n, T* out) {
  constexpr int V = 16 / sizeof(T);
  const int rows = BITS == 8 ? k : k / 2, vecs = n / kVecCols;
  const int64_t total = static_cast<int64_t>(rows) * vecs;
  const uint8_t* const data = static_cast<const uint8_t*>(q.data);
  wait_for_prior_kernels();
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(v / vecs), col = static_cast<int>(v % vecs) * kVecCols;
    const int4 packed = *reinterpret_cast<const int4*>(data + static_cast<int64_t>(r) * n + col);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&packed);
    float scale[kVecCols];
    float w0[kVecCols], w1[kVecCols];
    if constexpr (BITS == 8) {
      load16(q.scale + col, scale);
#pragma unroll
      for (int e = 0; e < kVecCols; ++e) {
        w0[e] = static_cast<float>(static_cast<int8_t>(b[e])) * scale[e];
      }
    } else {
      const int64_t g = static_cast<int64_t>(2 * r / q.group) * n + col;
      load16(q.scale + g, scale);
#pragma unroll
      for (int e = 0; e < kVecCols; ++e) {
        int lo = b[e] & 0xF, hi = b[e] >> 4;
        if constexpr (ZERO) {
          lo -= q.zero[g + e];
          hi -= q.zero[g + e];
        } else {
          lo = lo >= 8 ? lo - 16 : lo;  // two's complement nibbles
          hi = hi >= 8 ? hi - 16 : hi;
        }
        w0[e] = static_cast<float>(lo) * scale[e];
        w1[e] = static_cast<float>(hi) * scale[e];
      }
    }
    const int row0 = BITS == 8 ? r : 2 * r;
#pragma unroll
    for (int h = 0; h < kVecCols / V; ++h) {
      float part[V];
#pragma unroll
      for (int e = 0; e < V; ++e) part[e] = w0[h * V + e];
      store_vec<T, V>(out + static_cast<int64_t>(row0) * n + col + h * V, part);
      if constexpr (BITS == 4) {
#pragma unroll
        for (int e = 0; e < V; ++e) part[e] = w1[h * V + e];
        store_vec<T, V>(out + static_cast<int64_t>(row0 + 1) * n + col + h * V, part);
      }
    }
  }
}

struct Split {
  int tiles, ksplit, kchunk;  // kchunk: stored rows per k-split block, a multiple of 8 warp steps
};

// The warps' sums and, on rank 0 of a k-split, the other ranks'.
size_t quant_smem(int m, int ksplit) {
  return static_cast<size_t>(kWarps + ksplit - 1) * m * kTileCols * sizeof(float);
}

template <typename T>
Split quant_split(const GemvParams<T>& p, const GemvQuant<T>& q, int device) {
  static const int arch =
      code_arch(reinterpret_cast<const void*>(gemv_quant_kernel<__half, 1, 8, false>));
  const DeviceCaps caps = device_caps(device);
  const int rows = q.bits == 8 ? p.k : p.k / 2;
  const int step = kWarps * (q.bits == 8 ? QuantStep<8>::kRows : QuantStep<4>::kRows);
  const int tiles = ceil_div(p.n, kTileCols);
  int ksplit = 1;
  if (arch >= 90 && caps.major >= 9) {
    // The k-split whose blocks fill the SMs' slots (two blocks an SM) most evenly: blocks /
    // (waves * slots), so that no short last wave runs on a few SMs (the smaller split on a tie);
    // a power of two once chunks are whole block steps (clusters of other sizes leave a GPC's
    // SMs unfilled), each split at least one block step of rows.
    const int most = std::max(1, std::min(kMaxSplit, rows / step));
    const int slots = std::max(1, 2 * caps.sms);
    double best = 0.0;
    for (int s = 1; s <= most; s *= 2) {
      const int split = ceil_div(rows, ceil_div(ceil_div(rows, s), step) * step);
      if ((split & (split - 1)) != 0) continue;
      const int blocks = tiles * split;
      // int4 blocks stream half int8's bytes per row, so a second wave's fixed cost outweighs the
      // parallelism it adds there (int8 gains from it); benchmarks/HISTORY.md has the A/B.
      if (q.bits == 4 && blocks > slots && split > 1) continue;
      const double fill = static_cast<double>(blocks) / (ceil_div(blocks, slots) * slots);
      if (fill > best + 1e-9) {
        best = fill;
        ksplit = split;
      }
    }
  }
  const int kchunk = ceil_div(ceil_div(rows, ksplit), step) * step;
  return Split{tiles, ceil_div(rows, kchunk), kchunk};
}

template <typename T, int M, int BITS, bool ZERO>
cudaError_t launch_quant_rows(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                              cudaStream_t stream) {
  // Opt in to more than 48 KiB of shared memory once per device (a bit per device ordinal).
  static std::atomic<uint64_t> opted{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || (opted.load(std::memory_order_acquire) & bit) == 0) {
    const cudaError_t err = cudaFuncSetAttribute(gemv_quant_kernel<T, M, BITS, ZERO>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(quant_smem(M, kMaxSplit)));
    if (err != cudaSuccess) return err;
    opted.fetch_or(bit, std::memory_order_acq_rel);
  }
  const Split s = quant_split(p, q, device);
  LaunchShape shape;
  shape.block = dim3(kThreads);
  shape.grid = dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.ksplit), 1);
  shape.cluster_y = static_cast<unsigned>(s.ksplit);
  shape.smem = quant_smem(M, s.ksplit);
  return launch_kernel(shape, stream, gemv_quant_kernel<T, M, BITS, ZERO>, p, q, s.ksplit,
                       s.kchunk);
}

template <typename T, int BITS, bool ZERO>
cudaError_t launch_quant_format(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                                cudaStream_t stream) {
  switch (p.m) {
    case 1: return launch_quant_rows<T, 1, BITS, ZERO>(p, q, device, stream);
    case 2: return launch_quant_rows<T, 2, BITS, ZERO>(p, q, device, stream);
    case 3:
    case 4: return launch_quant_rows<T, 4, BITS, ZERO>(p, q, device, stream);
    default: return launch_quant_rows<T, 8, BITS, ZERO>(p, q, device, stream);
  }
}

bool weight_supported(int bits, int group, int k, int n, const void* data, const void* scale,
                      const void* zero, size_t scale_elem) {
  if (n <= 0 || k <= 0 || n % kVecCols != 0 || k % 8 != 0 || data == nullptr || scale == nullptr ||
      !aligned_to(data, 16) || !aligned_to(scale, static_cast<int>(kVecCols * scale_elem))) {
    return false;
  }
  if (bits == 8) return zero == nullptr;
  return bits == 4 && group > 0 && group % 2 == 0 && k % group == 0 && aligned_to(zero, 16);
}

}  // namespace

template <typename T>
bool gemv_quant_supported(const GemvParams<T>& p, const GemvQuant<T>& q) {
  if constexpr (sizeof(T) != 2) {
    return false;  // quantized weights serve 16-bit models only
  } else {
    // Tensor cores: sm_80+ code on an sm_80+ device (asked once, like the other GEMVs).
    static const int arch =
        code_arch(reinterpret_cast<const void*>(gemv_quant_kernel<T, 1, 8, false>));
    if (arch < 80) return false;
    if (p.m < 1 || p.m > kGemvMaxRows || p.transposed || p.beside || p.out == nullptr ||
        p.in == nullptr || !aligned_to(p.in, 16) ||
        !weight_supported(q.bits, q.group, p.k, p.n, q.data, q.scale, q.zero, sizeof(T))) {
      return false;
    }
    // Whole warp steps of 16 input rows, each inside one int4 group.
    if (p.k % 16 != 0 || (q.bits == 4 && q.group % 16 != 0)) return false;
    // Every block reads all of the input while others write their outputs.
    const auto a0 = reinterpret_cast<std::uintptr_t>(p.in);
    const auto b0 = reinterpret_cast<std::uintptr_t>(p.out);
    const size_t in_bytes = static_cast<size_t>(p.m) * p.k * sizeof(T);
    const size_t out_bytes = static_cast<size_t>(p.m) * p.n * sizeof(T);
    return !(a0 < b0 + out_bytes && b0 < a0 + in_bytes);
  }
}

template <typename T>
cudaError_t launch_gemv_quant(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                              cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return cudaErrorInvalidValue;
  } else {
    if (!gemv_quant_supported(p, q)) return cudaErrorInvalidValue;
    if (q.bits == 8) return launch_quant_format<T, 8, false>(p, q, device, stream);
    if (q.zero != nullptr) return launch_quant_format<T, 4, true>(p, q, device, stream);
    return launch_quant_format<T, 4, false>(p, q, device, stream);
  }
}

template <typename T>
cudaError_t launch_dequantize(const GemvQuant<T>& q, int k, int n, T* out, cudaStream_t stream) {
  if (sizeof(T) != 2 || out == nullptr || !aligned_to(out, 16) ||
      !weight_supported(q.bits, q.group, k, n, q.data, q.scale, q.zero, sizeof(T))) {
    return cudaErrorInvalidValue;
  }
  const int64_t vecs = static_cast<int64_t>(q.bits == 8 ? k : k / 2) * (n / kVecCols);
  LaunchShape shape;
  shape.block = dim3(256);
  shape.grid = dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(vecs, 256), 1 << 16)));
  if constexpr (sizeof(T) == 2) {
    if (q.bits == 8) {
      return launch_kernel(shape, stream, dequantize_kernel<T, 8, false>, q, k, n, out);
    }
    if (q.zero != nullptr) {
      return launch_kernel(shape, stream, dequantize_kernel<T, 4, true>, q, k, n, out);
    }
    return launch_kernel(shape, stream, dequantize_kernel<T, 4, false>, q, k, n, out);
  }
  return cudaErrorInvalidValue;
}

#define WF_GEMV_QUANT_INSTANTIATE(T)                                                        \
  template bool gemv_quant_supported<T>(const GemvParams<T>&, const GemvQuant<T>&);         \
  template cudaError_t launch_gemv_quant<T>(const GemvParams<T>&, const GemvQuant<T>&, int, \
                                            cudaStream_t);                                  \
  template cudaError_t launch_dequantize<T>(const GemvQuant<T>&, int, int, T*, cudaStream_t);
WF_GEMV_QUANT_INSTANTIATE(float)
WF_GEMV_QUANT_INSTANTIATE(__half)
WF_GEMV_QUANT_INSTANTIATE(__nv_bfloat16)
#undef WF_GEMV_QUANT_INSTANTIATE

}  // namespace kernels
}  // namespace warpformer

// The GEMV over weight-only quantized weights (gemv.h, "weight-only quantized weights") and their
// dequantization for many-row products.
//
// The [k, n] GEMV's scheme (gemv.cu) with a packed weight (16-bit models only): a block owns a
// tile of 8 column vectors of 16 bytes (128 columns: int8 and int4 both pack 16 columns into 16
// bytes of a stored row) and a range of stored rows; its 256 threads are 32 row slices x 8 column
// vectors, each streaming 8 stored rows per step (8 input rows for int8, 16 for int4). Bytes
// become floats by the exponent trick (a byte placed in the mantissa of 2^23, then 2^23 plus the
// offset subtracted: one byte permute and one add, where an integer-to-float conversion issues at
// an eighth of the FMA rate). int8 leaves its per-column scale to the epilogue; int4 applies its
// group's scale per step (a thread's 16 input rows of a step lie in one group): to the step's
// partial sums at 1-2 rows, to each weight past them (where the registers for partial sums are
// not there). The sums are reduced as gemv.cu's are: shuffles over a warp's 4 slices, the
// block's 8 warps in shared memory, and the blocks of a k-split (sm_90 clusters) through rank 0's
// shared memory, added in rank order, so results are deterministic run to run.
#include <algorithm>
#include <cstdint>

#include "kernels/cluster.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_common.cuh"

namespace warpformer {
namespace kernels {

using namespace gemv_impl;  // NOLINT(build/namespaces): the GEMV family's shared pieces

namespace {

constexpr int kColVecs = 8;   // 16-byte column vectors per tile
constexpr int kVecCols = 16;  // columns of one 16-byte vector of packed bytes
constexpr int kTileCols = kColVecs * kVecCols;
constexpr int kSlices = kThreads / kColVecs;  // row slices per block
constexpr int kRows = 8;                      // stored rows a thread streams per step
constexpr int kStep = kSlices * kRows;        // stored rows a block streams per step
constexpr int kMaxSplit = 8;                  // portable cluster size
constexpr float kMagic = 8388608.f;           // 2^23: a byte b in its mantissa reads 2^23 + b

// Blocks of 256 threads an SM holds at M rows (the launch bound, so that the registers fit).
__host__ __device__ constexpr int blocks_per_sm(int m, int bits) {
  return m == 1 && bits == 8 ? 3 : (m <= 2 ? 2 : 1);
}

// 2^23 + byte J of w.
template <int J>
__device__ __forceinline__ float byte_float(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | J));
}

// Input element k of row m as a float (0 for the rows past p.m of a rounded-up instantiation).
template <typename T>
__device__ __forceinline__ float input_at(const GemvParams<T>& p, int m, int k) {
  return m < p.m ? to_float(p.in[static_cast<int64_t>(m) * p.k + k]) : 0.f;
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

template <typename T, int M, int BITS, bool ZERO>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(M, BITS))
    gemv_quant_kernel(const GemvParams<T> p, const GemvQuant<T> q, int ksplit, int kchunk) {
  constexpr int kOut = M * kTileCols;
  __shared__ float red[kWarps][kOut];
  __shared__ __align__(8) uint64_t gather_bar;       // rank 0 of a k-split: the other ranks' sums
  extern __shared__ __align__(16) float gathered[];  // rank 0: [ksplit - 1][kOut]
  kn_split_begin<kOut>(ksplit, &gather_bar);
  const int n = p.n;
  const int rows = BITS == 8 ? p.k : p.k / 2;  // stored rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = threadIdx.x % kColVecs, s = threadIdx.x / kColVecs;
  const int col0 = blockIdx.x * kTileCols, col = col0 + c * kVecCols;
  const int kbeg = blockIdx.y * kchunk, kend = min(rows, kbeg + kchunk);
  const uint8_t* const data = static_cast<const uint8_t*>(q.data);

  float acc[M][kVecCols];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int e = 0; e < kVecCols; ++e) acc[m][e] = 0.f;
  }
  auto load_step = [&](int r0, int4(&wv)[kRows]) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      wv[i] = load_stream(data + static_cast<int64_t>(r0 + i) * n + col);
    }
  };
  // acc[m][e] += x[m][k] * w[k][col + e] over the step's stored rows r0 .. r0 + kRows - 1.
  auto fma_step = [&](int r0, const int4(&wv)[kRows]) {
    if constexpr (BITS == 8) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float x[M];
#pragma unroll
        for (int m = 0; m < M; ++m) x[m] = input_at(p, m, r0 + i);
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[i]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint32_t b = words[w] ^ 0x80808080u;  // q + 128, unsigned
          const float v[4] = {byte_float<0>(b), byte_float<1>(b), byte_float<2>(b),
                              byte_float<3>(b)};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float wq = v[j] - (kMagic + 128.f);
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m][4 * w + j] = fmaf(x[m], wq, acc[m][4 * w + j]);
          }
        }
      }
    } else {
      // The step's 16 input rows share a group: its scales (and zero points) for the 16 columns.
      const int64_t g = static_cast<int64_t>(2 * r0 / q.group) * n + col;
      float scale[kVecCols], offset[kVecCols];
      load16(q.scale + g, scale);
      if constexpr (ZERO) {
        const int4 zv = *reinterpret_cast<const int4*>(q.zero + g);
        const uint8_t* z = reinterpret_cast<const uint8_t*>(&zv);
#pragma unroll
        for (int e = 0; e < kVecCols; ++e) offset[e] = kMagic + static_cast<float>(z[e]);
      } else {
#pragma unroll
        for (int e = 0; e < kVecCols; ++e) offset[e] = kMagic + 8.f;  // nibbles as q + 8
      }
      // At 1-2 rows the step's sums of (q - zero) * x are scaled once; past them each weight is.
      constexpr bool kPartial = M <= 2;
      float part[kPartial ? M : 1][kVecCols];
      if constexpr (kPartial) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
#pragma unroll
          for (int e = 0; e < kVecCols; ++e) part[m][e] = 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float x0[M], x1[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          x0[m] = input_at(p, m, 2 * (r0 + i));
          x1[m] = input_at(p, m, 2 * (r0 + i) + 1);
        }
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[i]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint32_t b = ZERO ? words[w] : words[w] ^ 0x88888888u;
          const uint32_t lo = b & 0x0F0F0F0Fu, hi = (b >> 4) & 0x0F0F0F0Fu;
          const float vl[4] = {byte_float<0>(lo), byte_float<1>(lo), byte_float<2>(lo),
                               byte_float<3>(lo)};
          const float vh[4] = {byte_float<0>(hi), byte_float<1>(hi), byte_float<2>(hi),
                               byte_float<3>(hi)};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int e = 4 * w + j;
            if constexpr (kPartial) {
              const float w0 = vl[j] - offset[e], w1 = vh[j] - offset[e];
#pragma unroll
              for (int m = 0; m < M; ++m) part[m][e] = fmaf(x1[m], w1, fmaf(x0[m], w0, part[m][e]));
            } else {
              const float w0 = (vl[j] - offset[e]) * scale[e];
              const float w1 = (vh[j] - offset[e]) * scale[e];
#pragma unroll
              for (int m = 0; m < M; ++m) acc[m][e] = fmaf(x1[m], w1, fmaf(x0[m], w0, acc[m][e]));
            }
          }
        }
      }
      if constexpr (kPartial) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
#pragma unroll
          for (int e = 0; e < kVecCols; ++e) acc[m][e] = fmaf(part[m][e], scale[e], acc[m][e]);
        }
      }
    }
  };

  // Weights are static: the first step's loads go out before the wait for the kernel ahead.
  int r = kbeg + s * kRows;
  const bool early = p.prefetch_weight && col < n && r < kend;
  int4 first[kRows];
  if (early) load_step(r, first);
  wait_for_prior_kernels();
  start_next_kernel();
  if (col < n) {
    if (early) {
      fma_step(r, first);
      r += kStep;
    }
#pragma unroll(M <= 2 ? 2 : 1)
    for (; r < kend; r += kStep) {
      int4 wv[kRows];
      load_step(r, wv);
      fma_step(r, wv);
    }
  }

  kn_fold_warps<kColVecs>(acc, red, lane, warp);
  kn_store_sums(red, ksplit, &gather_bar, gathered, [&](int i, float v) {
    const int m = i / kTileCols, cc = col0 + i % kTileCols;
    if (m < p.m && cc < n) {
      if constexpr (BITS == 8) v *= to_float(q.scale[cc]);
      const int64_t idx = static_cast<int64_t>(m) * n + cc;
      p.out[idx] = from_float<T>(finish(v, p, idx, cc));
    }
  });
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
  int tiles, ksplit, kchunk;  // kchunk: stored rows per k-split block, a multiple of kRows
};

template <typename T>
Split quant_split(const GemvParams<T>& p, const GemvQuant<T>& q, int device) {
  static const int arch =
      code_arch(reinterpret_cast<const void*>(gemv_quant_kernel<__half, 1, 8, false>));
  const DeviceCaps caps = device_caps(device);
  const int rows = q.bits == 8 ? p.k : p.k / 2;
  const int tiles = ceil_div(p.n, kTileCols);
  int ksplit = 1;
  if (arch >= 90 && caps.major >= 9) {
    // The k-split whose blocks fill the SMs' slots most evenly: blocks / (waves * slots), so that
    // no short last wave runs on a few SMs (the smaller split on a tie); a power of two (clusters
    // of other sizes leave a GPC's SMs unfilled), each split at least one block step of rows,
    // and the split's gather within the 48 KiB a block may use without opting in to more.
    const int rows_m = p.m == 5 ? 6 : (p.m == 7 ? 8 : p.m);  // the instantiation's rows
    const size_t out_bytes = static_cast<size_t>(rows_m) * kTileCols * sizeof(float);
    const size_t static_bytes = kWarps * out_bytes + sizeof(uint64_t) + 128;
    const int smem_split = 1 + static_cast<int>((48 * 1024 - static_bytes) / out_bytes);
    const int most = std::max(1, std::min({kMaxSplit, rows / kStep, smem_split}));
    const int slots = std::max(1, blocks_per_sm(p.m, q.bits) * caps.sms);
    double best = 0.0;
    for (int s = 1; s <= most; s *= 2) {
      const int blocks = tiles * s;
      const double fill = static_cast<double>(blocks) / (ceil_div(blocks, slots) * slots);
      if (fill > best + 1e-9) {
        best = fill;
        ksplit = s;
      }
    }
  }
  const int kchunk = ceil_div(ceil_div(rows, ksplit), kRows) * kRows;
  return Split{tiles, ceil_div(rows, kchunk), kchunk};
}

template <typename T, int M, int BITS, bool ZERO>
cudaError_t launch_quant_rows(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                              cudaStream_t stream) {
  const Split s = quant_split(p, q, device);
  LaunchShape shape;
  shape.block = dim3(kThreads);
  shape.grid = dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.ksplit), 1);
  shape.cluster_y = static_cast<unsigned>(s.ksplit);
  shape.smem = static_cast<size_t>(s.ksplit - 1) * M * kTileCols * sizeof(float);
  return launch_kernel(shape, stream, gemv_quant_kernel<T, M, BITS, ZERO>, p, q, s.ksplit,
                       s.kchunk);
}

template <typename T, int BITS, bool ZERO>
cudaError_t launch_quant_format(const GemvParams<T>& p, const GemvQuant<T>& q, int device,
                                cudaStream_t stream) {
  switch (p.m) {
    case 1: return launch_quant_rows<T, 1, BITS, ZERO>(p, q, device, stream);
    case 2: return launch_quant_rows<T, 2, BITS, ZERO>(p, q, device, stream);
    case 3: return launch_quant_rows<T, 3, BITS, ZERO>(p, q, device, stream);
    case 4: return launch_quant_rows<T, 4, BITS, ZERO>(p, q, device, stream);
    case 5:
    case 6: return launch_quant_rows<T, 6, BITS, ZERO>(p, q, device, stream);
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
  if (sizeof(T) != 2) return false;  // quantized weights serve 16-bit models only
  if (p.m < 1 || p.m > kGemvMaxRows || p.transposed || p.beside || p.out == nullptr ||
      p.in == nullptr || !aligned_to(p.in, 16) ||
      !weight_supported(q.bits, q.group, p.k, p.n, q.data, q.scale, q.zero, sizeof(T))) {
    return false;
  }
  // Whole steps of kRows stored rows, each inside one int4 group.
  if (q.bits == 8 ? p.k % kRows != 0 : (p.k % (2 * kRows) != 0 || q.group % (2 * kRows) != 0)) {
    return false;
  }
  // Every block reads all of the input while others write their outputs.
  const auto a0 = reinterpret_cast<std::uintptr_t>(p.in);
  const auto b0 = reinterpret_cast<std::uintptr_t>(p.out);
  const size_t in_bytes = static_cast<size_t>(p.m) * p.k * sizeof(T);
  const size_t out_bytes = static_cast<size_t>(p.m) * p.n * sizeof(T);
  return !(a0 < b0 + out_bytes && b0 < a0 + in_bytes);
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

// Causal context (prefill) attention over packed, padding-free sequences (see attention.h).
//
// Flash-attention style on CUDA cores, fp32 throughout: one block of 128 threads owns a tile of
// kBQ = 32 queries of one (sequence, head); it walks the key tiles (kBK = 32 keys) up to the
// tile's last query position, keeping a running max / sum per query row (online softmax), so the
// [S, S] score matrix never exists outside shared memory. Q, K and V tiles are converted to fp32
// in shared memory (rows padded by one float so column walks hit distinct banks).
//
// Thread layout: row group rg = tid / 16 owns query rows 4*rg .. 4*rg + 3; column group cg = tid % 16
// owns keys cg, cg + 16 of each key tile for the scores and output dims cg + 16*c of the
// accumulator, so the softmax statistics of a row stay inside one half-warp (shuffle reductions)
// and the probabilities written to shared memory are read back by the same half-warp.
// The query-tile index is reversed so that the longest (last) tiles of a sequence start first.
#include "kernels/attention/attention_common.cuh"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kBQ = 32;       // queries per block
constexpr int kBK = 32;       // keys per tile
constexpr int kRows = 4;      // query rows per thread
constexpr int kColGroups = 16;

template <int D>
constexpr int smem_floats() {
  return kBQ * (D + 1) + kBK * (D + 1) + kBK * D + kBQ * (kBK + 1);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) context_attention_kernel(
    const ContextAttentionParams<T> p) {
  static_assert(D % kColGroups == 0, "head_dim must be a multiple of 16");
  wait_for_prior_kernels();
  constexpr int VEC = 16 / sizeof(T);
  constexpr int NV = D / VEC;           // vectors per head row
  constexpr int DC = D / kColGroups;    // accumulator columns per thread
  constexpr int QS = D + 1;             // padded row stride of Qs / Ks
  constexpr int PS = kBK + 1;           // padded row stride of Ps
  extern __shared__ float smem[];
  float* Qs = smem;                     // [kBQ][D + 1]
  float* Ks = Qs + kBQ * QS;            // [kBK][D + 1]
  float* Vs = Ks + kBK * QS;            // [kBK][D]
  float* Ps = Vs + kBK * D;             // [kBQ][kBK + 1]

  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBQ;
  const int seq_begin = p.cu_seqlens[b];
  const int len = min(p.cu_seqlens[b + 1] - seq_begin, p.max_seq);
  if (q0 >= len) return;
  const int slot = p.seq_slot[b];
  if (slot < 0 || slot >= p.num_slots) return;

  const int tid = threadIdx.x;
  const int rg = tid / kColGroups;
  const int cg = tid % kColGroups;
  const int64_t row_stride = static_cast<int64_t>(p.heads) * D;  // between tokens of q / out
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.f;

  // Q tile, pre-scaled; rows past the sequence are zero.
  for (int idx = tid; idx < kBQ * NV; idx += kThreads) {
    const int r = idx / NV;
    const int d = (idx - r * NV) * VEC;
    float v[VEC];
    if (q0 + r < len) {
      load_vec<T, VEC>(p.q + (seq_begin + q0 + r) * row_stride + h * D + d, v);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) Qs[r * QS + d + e] = v[e] * p.scale;
  }

  float m[kRows], l[kRows], acc[kRows][DC];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[i][c] = 0.f;
  }

  const int n_keys = min(q0 + kBQ, len);  // causal: no query of this tile sees a key >= n_keys
  const int64_t head_off = (static_cast<int64_t>(slot) * p.heads + h) * p.max_seq * D;
  const T* __restrict__ kbase = p.k_cache + head_off;
  const T* __restrict__ vbase = p.v_cache + head_off;

  for (int k0 = 0; k0 < n_keys; k0 += kBK) {
    __syncthreads();  // the previous tile's K/V (and, first time, nothing) are no longer read
    for (int idx = tid; idx < kBK * NV; idx += kThreads) {
      const int r = idx / NV;
      const int d = (idx - r * NV) * VEC;
      float kv[VEC], vv[VEC];
      if (k0 + r < n_keys) {
        const int64_t off = static_cast<int64_t>(k0 + r) * D + d;
        load_vec<T, VEC>(kbase + off, kv);
        load_vec<T, VEC>(vbase + off, vv);
      } else {  // never read garbage (NaN * 0 would poison the sums)
#pragma unroll
        for (int e = 0; e < VEC; ++e) kv[e] = vv[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        Ks[r * QS + d + e] = kv[e];
        Vs[r * D + d + e] = vv[e];
      }
    }
    __syncthreads();

    // Scores of 4 rows x 2 keys.
    float s[kRows][2];
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[i][0] = s[i][1] = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float k_a = Ks[cg * QS + d];
      const float k_b = Ks[(cg + kColGroups) * QS + d];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const float qv = Qs[(rg * kRows + i) * QS + d];
        s[i][0] = fmaf(qv, k_a, s[i][0]);
        s[i][1] = fmaf(qv, k_b, s[i][1]);
      }
    }

    // Mask, bias and the online-softmax update of each row.
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int q_pos = q0 + rg * kRows + i;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int k_pos = k0 + cg + c * kColGroups;
        if (k_pos > q_pos || k_pos >= n_keys) {
          s[i][c] = -INFINITY;
        } else {
          s[i][c] += slope * static_cast<float>(k_pos - q_pos);
        }
      }
      float tile_max = fmaxf(s[i][0], s[i][1]);
#pragma unroll
      for (int off = kColGroups / 2; off > 0; off >>= 1) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      }
      const float m_new = fmaxf(m[i], tile_max);
      const float alpha = attn::exp_shifted(m[i], m_new);
      const float p0 = attn::exp_shifted(s[i][0], m_new);
      const float p1 = attn::exp_shifted(s[i][1], m_new);
      float row_sum = p0 + p1;
#pragma unroll
      for (int off = kColGroups / 2; off > 0; off >>= 1) {
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
      }
      l[i] = l[i] * alpha + row_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[i][c] *= alpha;
      Ps[(rg * kRows + i) * PS + cg] = p0;
      Ps[(rg * kRows + i) * PS + cg + kColGroups] = p1;
    }
    __syncwarp();  // a row's probabilities are written and read by the same half-warp

    const int tile_keys = min(kBK, n_keys - k0);
    for (int j = 0; j < tile_keys; ++j) {
      float pv[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) pv[i] = Ps[(rg * kRows + i) * PS + j];
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const float v = Vs[j * D + cg + c * kColGroups];
#pragma unroll
        for (int i = 0; i < kRows; ++i) acc[i][c] = fmaf(pv[i], v, acc[i][c]);
      }
    }
    __syncwarp();  // Ps is rewritten by the next tile
  }

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = q0 + rg * kRows + i;
    if (r < len) {
      const float inv = 1.f / l[i];
      T* __restrict__ o = p.out + (seq_begin + r) * row_stride + h * D;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[cg + c * kColGroups] = from_float<T>(acc[i][c] * inv);
    }
  }
}

template <typename T, int D>
cudaError_t launch_for_dim(const ContextAttentionParams<T>& p, cudaStream_t stream) {
  constexpr size_t smem = smem_floats<D>() * sizeof(float);
  auto kernel = context_attention_kernel<T, D>;
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  LaunchShape shape;
  shape.grid = dim3(ceil_div(p.max_seqlen, kBQ), p.heads, p.batch);
  shape.block = dim3(kThreads);
  shape.smem = smem;
  return launch_kernel(shape, stream, kernel, p);
}

}  // namespace

template <typename T>
cudaError_t launch_context_attention(const ContextAttentionParams<T>& p, cudaStream_t stream) {
  if (p.batch < 0 || p.batch > 65535 || p.heads <= 0 || p.heads > 65535 || p.num_slots < 0 ||
      p.max_seq < 0 || p.max_seqlen < 0 || p.out == nullptr || p.q == nullptr ||
      p.k_cache == nullptr || p.v_cache == nullptr || p.cu_seqlens == nullptr ||
      p.seq_slot == nullptr) {
    return cudaErrorInvalidValue;
  }
  // 16-byte vector loads of q and of the cache rows.
  if (!aligned_to(p.q, 16) || !aligned_to(p.k_cache, 16) || !aligned_to(p.v_cache, 16)) {
    return cudaErrorMisalignedAddress;
  }
  if (p.batch == 0 || p.max_seqlen == 0) return cudaSuccess;
  return WF_HEAD_DIM_SWITCH(p.head_dim, HEAD_DIM,
                            [&] { return launch_for_dim<T, HEAD_DIM>(p, stream); });
}

template cudaError_t launch_context_attention<float>(const ContextAttentionParams<float>&,
                                                     cudaStream_t);
template cudaError_t launch_context_attention<__half>(const ContextAttentionParams<__half>&,
                                                      cudaStream_t);
template cudaError_t launch_context_attention<__nv_bfloat16>(
    const ContextAttentionParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

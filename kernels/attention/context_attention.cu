// Context (prefill) attention over packed, padding-free sequences, causal or bidirectional, with
// optional ALiBi and T5 relative position bias (see attention.h).
//
// Flash-attention style on CUDA cores, fp32 throughout: one block of 128 threads owns a tile of
// kBQ = 32 queries of one (sequence, head); it walks the key tiles (kBK = 32 keys) up to the
// tile's last query position (bidirectional: the sequence's last), keeping a running max / sum per
// query row (online softmax), so the [S, S] score matrix never exists outside shared memory. Q, K
// and V tiles are converted to fp32 in shared memory (rows padded by one float so column walks hit
// distinct banks). A sequence may continue one already cached (seq_past): its rows then sit at
// positions past + row, and the keys before them are read from the cache like the rest.
//
// Thread layout: row group rg = tid / 16 owns query rows 4*rg .. 4*rg + 3; column group cg = tid %
// 16 owns keys cg, cg + 16 of each key tile for the scores and output dims cg + 16*c of the
// accumulator, so the softmax statistics of a row stay inside one half-warp (shuffle reductions)
// and the probabilities written to shared memory are read back by the same half-warp.
// The query-tile index is reversed so that the longest (last) tiles of a sequence start first.
//
// fp16 / bf16 run on tensor cores instead (context_attention_mma_kernel, sm_80+): 4 warps own 16
// queries each; K and V tiles of 64 keys (32 for heads over 128) are staged in shared memory as
// stored (16-bit) and read with ldmatrix; S = Q K^T and O += P V are mma.sync m16n8k16 products
// with fp32 accumulation, the probabilities rounded to the input type for the second product (as
// flash attention does). The softmax runs in base 2 on log2(e)-scaled scores, the same function.
#include <algorithm>

#include "kernels/attention/attention_common.cuh"
#include "kernels/mma.cuh"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kBQ = 32;   // queries per block
constexpr int kBK = 32;   // keys per tile
constexpr int kRows = 4;  // query rows per thread
constexpr int kColGroups = 16;

// One block's work in either context kernel: sequence blockIdx.z, head blockIdx.y and the query
// tile of `rows` queries numbered from the sequence's end (reversed tile index, see above).
// Rows are counted locally (q0, len: which rows of q / out) and sit at cache positions past +
// row; len is clamped so that past + len <= max_seq. False when the tile starts past the
// sequence, or the sequence's cache slot or past is out of range: the block has nothing to do.
struct ContextTile {
  int h, q0, seq_begin, len, slot, past;
};

template <typename T>
__device__ __forceinline__ bool context_tile(const ContextAttentionParams<T>& p, int rows,
                                             ContextTile& t) {
  const int b = blockIdx.z;
  t.h = blockIdx.y;
  t.q0 = (gridDim.x - 1 - blockIdx.x) * rows;
  t.seq_begin = p.cu_seqlens[b];
  t.past = p.seq_past != nullptr ? p.seq_past[b] : 0;
  // past in [0, max_seq) keeps max_seq - past positive, so nothing below overflows.
  if (t.past < 0 || t.past >= p.max_seq) return false;
  t.len = min(p.cu_seqlens[b + 1] - t.seq_begin, p.max_seq - t.past);
  if (t.q0 >= t.len) return false;
  t.slot = p.seq_slot[b];
  return t.slot >= 0 && t.slot < p.num_slots;
}

// T5's relative position bias of head h, indexed by the key - query distance d in [-M, M] (the
// caller clamps), or null without a table. The head's offset is formed once, in 64 bits (heads x
// (2M + 1) may pass 2^31).
template <typename T>
__device__ __forceinline__ const float* relative_bias_row(const ContextAttentionParams<T>& p,
                                                          int h) {
  if (p.position_bias == nullptr) return nullptr;
  const int M = p.bias_max_distance;
  return p.position_bias + static_cast<int64_t>(h) * (2 * M + 1) + M;
}

__device__ __forceinline__ int clamp_distance(int d, int M) { return min(max(d, -M), M); }

template <int D>
constexpr int smem_floats() {
  return kBQ * (D + 1) + kBK * (D + 1) + kBK * D + kBQ * (kBK + 1);
}

// BIDI, REL (both kernels): bidirectional attention (causal == false) and T5's relative position
// bias (position_bias set), the encoder-decoder models' extensions. Template arguments, so that
// the causal kernels without a table keep their code and registers (as runtime branches they
// took up to 37 more registers in the tensor-core kernel, a block less per SM).
template <typename T, int D, bool BIDI, bool REL>
__global__ void __launch_bounds__(kThreads)
    context_attention_kernel(const ContextAttentionParams<T> p) {
  static_assert(D % kColGroups == 0, "head_dim must be a multiple of 16");
  wait_for_prior_kernels();
  constexpr int VEC = 16 / sizeof(T);
  constexpr int NV = D / VEC;         // vectors per head row
  constexpr int DC = D / kColGroups;  // accumulator columns per thread
  constexpr int QS = D + 1;           // padded row stride of Qs / Ks
  constexpr int PS = kBK + 1;         // padded row stride of Ps
  extern __shared__ float smem[];
  float* Qs = smem;           // [kBQ][D + 1]
  float* Ks = Qs + kBQ * QS;  // [kBK][D + 1]
  float* Vs = Ks + kBK * QS;  // [kBK][D]
  float* Ps = Vs + kBK * D;   // [kBQ][kBK + 1]

  ContextTile t;
  if (!context_tile(p, kBQ, t)) return;
  const int h = t.h, slot = t.slot;
  // Rows as cache positions only (the masks, the window and the bias), so that no row index stays
  // live next to them: position P is row row_off + P of q / out, and positions >= end lie past
  // the sequence.
  const int pos0 = t.past + t.q0, end = t.past + t.len, row_off = t.seq_begin - t.past;

  const int tid = threadIdx.x;
  const int rg = tid / kColGroups;
  const int cg = tid % kColGroups;
  const int64_t row_stride = static_cast<int64_t>(p.heads) * D;  // between tokens of q / out
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.f;
  const float* __restrict__ rel = REL ? relative_bias_row(p, h) : nullptr;
  const int rel_m = REL ? p.bias_max_distance : 0;

  // Q tile, pre-scaled; rows past the sequence are zero.
  for (int idx = tid; idx < kBQ * NV; idx += kThreads) {
    const int r = idx / NV;
    const int d = (idx - r * NV) * VEC;
    float v[VEC];
    if (pos0 + r < end) {
      load_vec<T, VEC>(p.q + (row_off + pos0 + r) * row_stride + h * D + d, v);
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

  // No query of the tile sees a key >= n_keys: causal, none past the tile's last row; else none
  // past the sequence.
  constexpr bool causal = !BIDI;
  const int n_keys = causal ? min(pos0 + kBQ, end) : end;
  const int kvh = p.kv_heads > 0 ? p.kv_heads : p.heads;  // query head h reads h / group
  const int64_t head_off = (static_cast<int64_t>(slot) * kvh + h / (p.heads / kvh)) * p.max_seq * D;
  const T* __restrict__ kbase = p.k_cache + head_off;
  const T* __restrict__ vbase = p.v_cache + head_off;

  for (int k0 = attn::first_key_tile(p.window, pos0, kBK); k0 < n_keys; k0 += kBK) {
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
      const int q_pos = pos0 + rg * kRows + i;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int k_pos = k0 + cg + c * kColGroups;
        if ((causal && k_pos > q_pos) || k_pos >= n_keys ||
            attn::outside_window(p.window, k_pos, q_pos)) {
          s[i][c] = -INFINITY;
        } else {
          s[i][c] += slope * static_cast<float>(k_pos - q_pos);
          if (REL) s[i][c] += __ldg(rel + clamp_distance(k_pos - q_pos, rel_m));
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
    const int pos = pos0 + rg * kRows + i;
    if (pos < end) {
      const float inv = 1.f / l[i];
      T* __restrict__ o = p.out + (row_off + pos) * row_stride + h * D;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[cg + c * kColGroups] = from_float<T>(acc[i][c] * inv);
    }
  }
}

// ---- tensor cores ---------------------------------------------------------------------------
constexpr int kMmaWarps = 4;
constexpr int kMmaBQ = 16 * kMmaWarps;  // queries per block, 16 per warp
// Keys per tile: 64 (= kMmaBQ: the diagonal tile is the last), 32 for heads over 128, whose K
// and V tiles would otherwise not fit the 48 KiB of static shared memory and whose fp32 output
// accumulators (D / 2 registers a lane) leave no room for 64 keys' scores.
template <int D>
constexpr int kMmaKeys = D > 128 ? 32 : 64;
constexpr float kLog2e = 1.4426950408889634f;

// 16-bit values of 4 bytes' alignment as one register.
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <typename T, int D, bool BIDI, bool REL>
__global__ void __launch_bounds__(kMmaWarps * 32)
    context_attention_mma_kernel(const ContextAttentionParams<T> p) {
  static_assert(D % 16 == 0 && D <= 256, "head_dim a multiple of 16, at most 256");
  constexpr int kMmaBK = kMmaKeys<D>;
  wait_for_prior_kernels();
  constexpr int S = D + 8;        // smem row stride in elements: ldmatrix rows on distinct banks
  constexpr int KSTEPS = D / 16;  // mma k-steps of Q K^T over the head
  constexpr int DTILES = D / 8;   // 8-wide output tiles
  constexpr int NT = kMmaBK / 8;  // 8-key tiles of the scores
  constexpr int CH = D / 8;       // 16-byte chunks of a row
  __shared__ __align__(16) T Ks[kMmaBK * S];
  __shared__ __align__(16) T Vs[kMmaBK * S];
  // REL: the relative bias of the key - query distances a tile meets, k0 - pos0 - (kMmaBQ - 1) +
  // j for j < kMmaBQ + kMmaBK - 1, staged with the tile's keys, so that each score reads it from
  // shared memory at an offset fixed per lane (a global load per score took ~20 more registers).
  __shared__ float rel_s[REL ? kMmaBQ + kMmaBK : 1];

  ContextTile t;
  if (!context_tile(p, kMmaBQ, t)) return;
  const int h = t.h, slot = t.slot;
  // Rows as cache positions only, as in context_attention_kernel.
  const int pos0 = t.past + t.q0, end = t.past + t.len, row_off = t.seq_begin - t.past;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int64_t row_stride = static_cast<int64_t>(p.heads) * D;  // between tokens of q / out
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.f;
  const float* __restrict__ rel = REL ? relative_bias_row(p, h) : nullptr;
  const int rel_m = REL ? p.bias_max_distance : 0;
  // This lane's two query rows, at positions pos_a and pos_b; rows at or past end read zeros and
  // are not written.
  const int pos_a = pos0 + warp * 16 + g, pos_b = pos_a + 8;
  const T* qa_row = p.q + (row_off + min(pos_a, end - 1)) * row_stride + h * D;
  const T* qb_row = p.q + (row_off + min(pos_b, end - 1)) * row_stride + h * D;
  uint32_t qf[KSTEPS][4];
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const int d = ks * 16 + 2 * q;
    qf[ks][0] = pos_a < end ? load_pair(qa_row + d) : 0u;
    qf[ks][1] = pos_b < end ? load_pair(qb_row + d) : 0u;
    qf[ks][2] = pos_a < end ? load_pair(qa_row + d + 8) : 0u;
    qf[ks][3] = pos_b < end ? load_pair(qb_row + d + 8) : 0u;
  }

  float o[DTILES][4];
#pragma unroll
  for (int t = 0; t < DTILES; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  // Running max (log2 units) and this lane's share of the sum, rows a and b.
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

  // No query of the tile sees a key >= n_keys (as in context_attention_kernel).
  constexpr bool causal = !BIDI;
  const int n_keys = causal ? min(pos0 + kMmaBQ, end) : end;
  const int kvh = p.kv_heads > 0 ? p.kv_heads : p.heads;  // query head h reads h / group
  const int64_t head_off = (static_cast<int64_t>(slot) * kvh + h / (p.heads / kvh)) * p.max_seq * D;
  const T* __restrict__ kbase = p.k_cache + head_off;
  const T* __restrict__ vbase = p.v_cache + head_off;
  const int mat = lane >> 3, mrow = lane & 7;  // the ldmatrix tile and row this lane addresses

  for (int k0 = attn::first_key_tile(p.window, pos0, kMmaBK); k0 < n_keys; k0 += kMmaBK) {
    __syncthreads();  // the previous tile's K/V are no longer read
    for (int idx = tid; idx < kMmaBK * CH; idx += kMmaWarps * 32) {
      const int r = idx / CH;
      const int c = (idx - r * CH) * 8;
      int4 kv = make_int4(0, 0, 0, 0), vv = kv;  // never read garbage (NaN * 0 poisons sums)
      if (k0 + r < n_keys) {
        const int64_t off = static_cast<int64_t>(k0 + r) * D + c;
        kv = *reinterpret_cast<const int4*>(kbase + off);
        vv = *reinterpret_cast<const int4*>(vbase + off);
      }
      *reinterpret_cast<int4*>(Ks + r * S + c) = kv;
      *reinterpret_cast<int4*>(Vs + r * S + c) = vv;
    }
    if (REL && tid < kMmaBQ + kMmaBK - 1) {
      rel_s[tid] = __ldg(rel + clamp_distance(k0 - pos0 - (kMmaBQ - 1) + tid, rel_m));
    }
    __syncthreads();

    // Scores: 16 queries x kMmaBK keys per warp. ldmatrix tile i of a pair of 8-key tiles: keys
    // +8 * (i / 2), dims +8 * (i % 2) -- the "b" registers of key tiles nt and nt + 1.
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t kb[4];
        ldmatrix_x4(kb, Ks + (nt * 8 + (mat >> 1) * 8 + mrow) * S + ks * 16 + (mat & 1) * 8);
        mma_16816<T>(s[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kb[0], kb[1]);
        mma_16816<T>(s[nt + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kb[2], kb[3]);
      }
    }

    // Mask, bias and the online-softmax update (registers 0-1: row a, 2-3: row b). A tile whose
    // keys all lie at or before this warp's first row's position (bidirectional: any), inside the
    // sequence and inside its last row's window (all but the diagonal tiles of a long prompt)
    // needs no mask, and without ALiBi no ALiBi term either: those tiles skip that arithmetic.
    // The tests are warp-uniform, and the scores keep their bits (a zero bias term adds nothing).
    // REL adds the relative bias in every variant.
    const bool masked = (causal && k0 + kMmaBK - 1 > pos0 + warp * 16) || k0 + kMmaBK > n_keys ||
                        attn::outside_window(p.window, k0, pos0 + warp * 16 + 15);
    float mx_a = -INFINITY, mx_b = -INFINITY;
    // rel_s index of this lane's key - query distance: key - pos - (k0 - pos0 - (kMmaBQ - 1)),
    // in [0, kMmaBQ + kMmaBK - 2], with the register's offsets added below.
    const int rel_lane = 2 * q - g - warp * 16 + kMmaBQ - 1;
    auto score = [&](int nt, int i, bool mask, bool bias, bool relative) {
      const int key = k0 + nt * 8 + 2 * q + (i & 1);
      const int pos = i < 2 ? pos_a : pos_b;
      float v = s[nt][i] * p.scale;
      if (bias) v = v + slope * static_cast<float>(key - pos);
      if (relative) v = v + rel_s[rel_lane + nt * 8 + (i & 1) - (i >> 1) * 8];
      v = mask && ((causal && key > pos) || key >= n_keys ||
                   attn::outside_window(p.window, key, pos))
              ? -INFINITY
              : v * kLog2e;
      s[nt][i] = v;
      if (i < 2)
        mx_a = fmaxf(mx_a, v);
      else
        mx_b = fmaxf(mx_b, v);
    };
    auto scores = [&](bool mask, bool bias, bool relative) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) score(nt, i, mask, bias, relative);
      }
    };
    if (!masked && slope == 0.f) {
      scores(false, false, REL);
    } else if (!masked) {
      scores(false, true, REL);
    } else {
      scores(true, true, REL);
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {  // the four lanes of a row
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    // Without a window every row has a key at or before its position in its first tile, so the
    // maxima are finite; with one, a row may meet a tile of only masked keys first, whose
    // maximum stays -inf: it shifts by 0 instead (every term then 0, not NaN).
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float sh_a = mn_a == -INFINITY ? 0.f : mn_a, sh_b = mn_b == -INFINITY ? 0.f : mn_b;
    const float alpha_a = exp2f(m_a - sh_a), alpha_b = exp2f(m_b - sh_b);
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - sh_a);
      s[nt][1] = exp2f(s[nt][1] - sh_a);
      s[nt][2] = exp2f(s[nt][2] - sh_b);
      s[nt][3] = exp2f(s[nt][3] - sh_b);
      sum_a += s[nt][0] + s[nt][1];
      sum_b += s[nt][2] + s[nt][3];
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int t = 0; t < DTILES; ++t) {
      o[t][0] *= alpha_a;
      o[t][1] *= alpha_a;
      o[t][2] *= alpha_b;
      o[t][3] *= alpha_b;
    }

    // O += P V over the tile's kMmaBK keys, 16 per k-step: P's "a" registers are the scores'
    // accumulators of key tiles 2kk and 2kk + 1; V's "b" come transposed from ldmatrix (tile i:
    // keys +8 * (i % 2), dims +8 * (i / 2) -- the registers of output tiles dt and dt + 1).
#pragma unroll
    for (int kk = 0; kk < kMmaBK / 16; ++kk) {
      const uint32_t a0 = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dt = 0; dt < DTILES; dt += 2) {
        uint32_t vb[4];
        ldmatrix_x4<true>(vb, Vs + (kk * 16 + (mat & 1) * 8 + mrow) * S + dt * 8 + (mat >> 1) * 8);
        mma_16816<T>(o[dt], a0, a1, a2, a3, vb[0], vb[1]);
        mma_16816<T>(o[dt + 1], a0, a1, a2, a3, vb[2], vb[3]);
      }
    }
  }

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  T* __restrict__ out_a = p.out + (row_off + pos_a) * row_stride + h * D + 2 * q;
  T* __restrict__ out_b = p.out + (row_off + pos_b) * row_stride + h * D + 2 * q;
#pragma unroll
  for (int t = 0; t < DTILES; ++t) {
    if (pos_a < end) {
      *reinterpret_cast<uint32_t*>(out_a + t * 8) = pack2<T>(o[t][0] * inv_a, o[t][1] * inv_a);
    }
    if (pos_b < end) {
      *reinterpret_cast<uint32_t*>(out_b + t * 8) = pack2<T>(o[t][2] * inv_b, o[t][3] * inv_b);
    }
  }
}

// Whether the tensor-core kernel runs: sm_80+ device and code.
bool use_mma() {
  static const bool built = code_arch(reinterpret_cast<const void*>(
                                context_attention_mma_kernel<__half, 64, false, false>)) >= 80;
  int device = 0;
  if (!built || cudaGetDevice(&device) != cudaSuccess) return false;
  return device_caps(device).major >= 8;
}

template <typename T, int D, bool BIDI, bool REL>
cudaError_t launch_for_dim(const ContextAttentionParams<T>& p, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    if (aligned_to(p.out, 4) && use_mma()) {  // it stores two outputs per 4-byte write
      LaunchShape shape;
      shape.grid = dim3(ceil_div(p.max_seqlen, kMmaBQ), p.heads, p.batch);
      shape.block = dim3(kMmaWarps * 32);
      return launch_kernel(shape, stream, context_attention_mma_kernel<T, D, BIDI, REL>, p);
    }
  }
  constexpr size_t smem = smem_floats<D>() * sizeof(float);
  auto kernel = context_attention_kernel<T, D, BIDI, REL>;
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
  if (p.batch < 0 || p.batch > 65535 || p.heads <= 0 || p.heads > 65535 || p.kv_heads < 0 ||
      p.window < 0 || (!p.causal && p.window > 0) || p.bias_max_distance < 0 ||
      p.bias_max_distance > 65535 || (p.kv_heads > 0 && p.heads % p.kv_heads != 0) ||
      p.num_slots < 0 || p.max_seq < 0 || p.max_seqlen < 0 || p.out == nullptr || p.q == nullptr ||
      p.k_cache == nullptr || p.v_cache == nullptr || p.cu_seqlens == nullptr ||
      p.seq_slot == nullptr) {
    return cudaErrorInvalidValue;
  }
  // 16-byte vector loads of q and of the cache rows.
  if (!aligned_to(p.q, 16) || !aligned_to(p.k_cache, 16) || !aligned_to(p.v_cache, 16)) {
    return cudaErrorMisalignedAddress;
  }
  if (p.batch == 0 || p.max_seqlen == 0) return cudaSuccess;
  const bool rel = p.position_bias != nullptr;  // see BIDI, REL
  return WF_HEAD_DIM_SWITCH(p.head_dim, HEAD_DIM, [&] {
    if (p.causal) {
      return rel ? launch_for_dim<T, HEAD_DIM, false, true>(p, stream)
                 : launch_for_dim<T, HEAD_DIM, false, false>(p, stream);
    }
    return rel ? launch_for_dim<T, HEAD_DIM, true, true>(p, stream)
               : launch_for_dim<T, HEAD_DIM, true, false>(p, stream);
  });
}

template cudaError_t launch_context_attention<float>(const ContextAttentionParams<float>&,
                                                     cudaStream_t);
template cudaError_t launch_context_attention<__half>(const ContextAttentionParams<__half>&,
                                                      cudaStream_t);
template cudaError_t launch_context_attention<__nv_bfloat16>(
    const ContextAttentionParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

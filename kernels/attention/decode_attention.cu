// Decode (single new token per row) masked multi-head attention over the KV cache, with optional
// beam-search cache indirection, ALiBi, T5's relative position bias and split-KV (flash-decoding);
// see attention.h.
//
// One block of 256 threads per (head, row, key chunk). Threads form groups of TPK lanes; a group
// reads one cache row (key or value) at a time with 16-byte vectors, TPK = the number of vectors in
// a head row rounded up to a power of two (at least 8, at most 32; heads of more than 32 vectors,
// such as fp32 head_dim 256, take two vectors per lane). The chunk is walked in windows of NGROUPS
// x UNROLL keys (each group takes every NGROUPS-th key, UNROLL keys in flight). One pass: a group
// loads a window's key and value rows together, reduces q.k over its lanes with shuffles, and folds
// the window into its own running max, exp-sum and p * v accumulator (online softmax, rescaling by
// exp(old max - new max)), so a window costs one round trip to the cache and no barrier. At the end
// the groups' accumulators meet in shared memory, each weighted by exp(group max - block max). At
// 1-2 rows the fused kernel loads the first window's key and value rows before the wait for the QKV
// product (which starts it early): no kernel in flight writes them, except the new token's row,
// which the block takes from its own copy after preparing it. A context within one window then
// costs no round trip to the cache after the wait. Without a split the block writes the normalised
// output. With a split it writes the unnormalised sum, the max and the exp-sum of its chunk to the
// workspace, and decode_combine_kernel merges the chunks of a (row, head) with the usual rescaling.
#include "kernels/attention/attention_common.cuh"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kSplitThreshold = 2048;  // max_seq at which long caches are split
constexpr int kSmallWorkChunk = 512;   // keys per chunk when rows * heads is small
constexpr int kLargeWorkChunk = 4096;  // keys per chunk otherwise (the pairs fill the GPU)
constexpr int kSmallWork = 1024;       // rows * heads below which (row, head) pairs are split

constexpr int next_pow2(int x) { return x <= 1 ? 1 : 2 * next_pow2((x + 1) / 2); }

// Keys per block for a given split (the last chunk may be shorter).
int chunk_size(int max_seq, int splits) { return ceil_div(max_seq, splits); }

template <typename T, int D>
struct DecodeShape {
  static constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte vector
  static constexpr int NVEC = D / VEC;        // vectors per head row
  // Lanes per cache row; at least 8, so that the groups (kThreads / TPK) fit the lanes of one
  // warp in the final merge (16-bit heads of 32 leave half of each group's lanes idle).
  static constexpr int TPK = NVEC >= 32 ? 32 : (NVEC <= 8 ? 8 : next_pow2(NVEC));
  static constexpr int NV = (NVEC + TPK - 1) / TPK;  // vectors per lane
  static constexpr int NGROUPS = kThreads / TPK;
  static_assert(D % VEC == 0, "head_dim must be a multiple of the vector width");
};

// The fused kernel's QKV preparation in two parts. load_new_token reads what this thread needs
// of the new token: its rotary pair j = threadIdx.x of q and k (bias added), its element of v,
// its rotary frequency. It runs first thing after the wait. prepare_new_token then forms the
// block's query, rotated at the new token's position and rounded to T like launch_qkv_prep's
// q_out, into q_s. When the block's key chunk [start, end) holds that position, it also writes
// the new key and value into the cache, and into k_s / v_s, from which the window takes that row
// (the window loaded before the wait leaves it out). The arithmetic is qkv_prep_kernel's (the
// angle exactly as attn::rotary_table forms it), so fused and unfused results are bit-identical.
// Every pair, element and angle belongs to one thread (D <= kThreads), so none passes through
// shared memory on its way. It ends with a barrier: q_s, k_s and v_s are read by every thread.
struct NewToken {
  float qa = 0.f, qb = 0.f, ka = 0.f, kb = 0.f;  // the pair's q and k elements, biased
  float v = 0.f;                                 // v element threadIdx.x, biased
  float inv_freq = 0.f;                          // rotary frequency of pair threadIdx.x
};

template <typename T, int D>
__device__ __forceinline__ NewToken load_new_token(const DecodeAttentionParams<T>& p,
                                                   const DecodeQkvInputs<T>& f, int row, int h) {
  static_assert(D <= kThreads, "one thread per pair and per element of v");
  NewToken t;
  // qkv row [heads + 2 kvh, D]: query head h, then its key and value head h / group (multi-head
  // attention: [3, heads, D], the same offsets with kvh = heads).
  const int kvh = p.kv_heads > 0 ? p.kv_heads : p.heads;
  const int64_t kv = h / (p.heads / kvh);
  const T* src = f.qkv + static_cast<int64_t>(row) * (p.heads + 2 * kvh) * D;
  auto load = [&](int part, int d) {
    const int64_t head = part == 0 ? h : p.heads + (part == 1 ? kv : kvh + kv);
    const int64_t off = head * D + d;
    return attn::load_biased(src, f.qkv_bias, off, static_cast<int>(off));
  };
  const int rot_half = f.rotary_style == RotaryStyle::kNone ? 0 : f.rotary_dim / 2;
  const int j = threadIdx.x;
  if (j < D / 2) {
    int a, b;
    attn::rotary_pair(j, rot_half, f.rotary_style == RotaryStyle::kInterleaved, a, b);
    t.qa = load(0, a);
    t.qb = load(0, b);
    t.ka = load(1, a);
    t.kb = load(1, b);
  }
  if (j < D) t.v = load(2, j);
  if (j < rot_half) t.inv_freq = f.rotary_inv_freq[j];
  return t;
}

template <typename T, int D>
__device__ __forceinline__ void prepare_new_token(const DecodeAttentionParams<T>& p,
                                                  const DecodeQkvInputs<T>& f, const NewToken& t,
                                                  int pos, int h, int slot, int start, int end,
                                                  float* q_s, T* k_s, T* v_s) {
  // pos: launch_qkv_prep's token_pos (unclamped). The blocks of a group of query heads sharing a
  // key/value head (grouped-query attention) each write the same new key and value (the same
  // bits), so each reads back its own write, as with one block per head.
  const int kvh = p.kv_heads > 0 ? p.kv_heads : p.heads, group = p.heads / kvh;
  const bool write = pos >= start && pos < end;
  const int rot_half = f.rotary_style == RotaryStyle::kNone ? 0 : f.rotary_dim / 2;
  // The caches are const in the params (the plain kernel only reads them); the fused one writes
  // the new row, which only the blocks writing it (its group's) read.
  const int64_t cache_off = ((static_cast<int64_t>(slot) * kvh + h / group) * p.max_seq + pos) * D;
  T* k_new = const_cast<T*>(p.k_cache) + cache_off;
  T* v_new = const_cast<T*>(p.v_cache) + cache_off;
  const int j = threadIdx.x;
  if (j < D / 2) {
    int a, b;
    const bool rot =
        attn::rotary_pair(j, rot_half, f.rotary_style == RotaryStyle::kInterleaved, a, b);
    float qx = t.qa, qy = t.qb, kx = t.ka, ky = t.kb;
    if (rot) {
      float sn, cs;
      sincosf(static_cast<float>(pos) * t.inv_freq, &sn, &cs);
      cs = __fmul_rn(cs, f.rotary_mscale);
      sn = __fmul_rn(sn, f.rotary_mscale);
      attn::rotate(t.qa, t.qb, cs, sn, qx, qy);
      attn::rotate(t.ka, t.kb, cs, sn, kx, ky);
    }
    q_s[a] = to_float(from_float<T>(qx));
    q_s[b] = to_float(from_float<T>(qy));
    if (write) {
      k_new[a] = k_s[a] = from_float<T>(kx);
      k_new[b] = k_s[b] = from_float<T>(ky);
    }
  }
  if (write && j < D) v_new[j] = v_s[j] = from_float<T>(t.v);
  __syncthreads();
}

// FUSED: the QKV preparation (f) runs first. The fused fields travel as a separate small
// argument, so that both instantiations address the main parameters alike (a larger parameter
// struct made the compiler address it through a register, which slowed the kernel:
// benchmarks/HISTORY.md, "Figures moved from ARCHITECTURE.md (issue 50)").
// EARLY (fused only, launched for 1-2 rows): the GEMV ahead starts the kernel early and the
// first window's loads come before the wait (below).
// Blocks per SM: the unfused kernel runs many blocks to an SM at batch 64, bounded to four (55-64
// registers; the two-pass kernel before took 80 and three blocks without the bound). The fused
// kernel past 2 rows is bounded to three (60-71 registers): a long context's split keys make
// several blocks per SM, so the third block pays there. The early kernel keeps its registers
// (91-96, two blocks): bounded to three it was slower at one row (both in benchmarks/HISTORY.md,
// "LayerNorm's statistics in one reduction; the fused attention past 2 rows at three blocks per
// SM"). None of them spills (sm_90, nvcc 13, ptxas -v). Requesting each window's rows before
// folding in the one ahead (the early kernel, 115-124 registers) made batch 1 and 2 steps slower
// (benchmarks/HISTORY.md, "The decode attention in one pass").
// REL: position_bias is set (T5's relative position bias, read from its table per key). A
// template argument rather than a branch, so that the kernels without it keep their code and
// registers; with it, 60-64 registers unfused, 68-76 fused, 92-101 early, none spilling.
template <typename T, int D, bool FUSED, bool EARLY, bool REL>
__global__ void __launch_bounds__(kThreads, FUSED ? (EARLY ? 2 : 3) : 4)
    decode_attention_kernel(const DecodeAttentionParams<T> p, int splits, int chunk,
                            const DecodeQkvInputs<T> f) {
  using S = DecodeShape<T, D>;
  using Row = int4;  // a lane's 16 bytes of a cache row, as loaded (zeros: +0 in every type)
  constexpr int VEC = S::VEC, NVEC = S::NVEC, TPK = S::TPK, NV = S::NV, NGROUPS = S::NGROUPS;
  // Keys in flight per group (each with its value row); a window is NGROUPS x UNROLL keys (128 for
  // 64-wide 16-bit heads). 8 was no faster at one row and slower at 8 rows, with 120 registers
  // for the fused kernel and spills in bf16 (benchmarks/HISTORY.md, "The decode attention's first
  // window before the wait"). Two vectors per lane (fp32, head_dim 256) take 2, which holds the
  // rows in flight to the same 8 vectors a lane (with 4 the unfused kernel spilled ~400 bytes).
  constexpr int UNROLL = NV > 1 ? 2 : 4, WINDOW = NGROUPS * UNROLL;
  __shared__ float red[NGROUPS * D];                    // the groups' accumulators, [NGROUPS][D]
  __shared__ float group_m[NGROUPS], group_l[NGROUPS];  // their running maxima and exp-sums

  const int h = blockIdx.x;
  const int row = blockIdx.y;
  const int split = blockIdx.z;
  const int g = threadIdx.x / TPK;
  const int li = threadIdx.x % TPK;
  const int64_t out_off = (static_cast<int64_t>(row) * p.heads + h) * D;
  const int64_t part = (static_cast<int64_t>(row) * p.heads + h) * splits + split;

  // When the GEMV ahead started this kernel early (fused, 1-2 rows), the row's length, slot and
  // indirection and the first window's cache rows are read before the wait. That GEMV, the QKV
  // product, starts this kernel only after its own wait (start_next_kernel), so every kernel
  // before it has completed, and it writes none of these. Of the cache rows only the new token's
  // is written in this call, by this block (the other blocks write only positions that no other
  // row reads: attention.h). Otherwise everything follows the wait, the length in one round trip
  // with the new token's inputs, then each window's key and value rows together (a length read
  // before a wait that nothing overlaps would add a round trip of its own to the chain).
  static_assert(FUSED || !EARLY, "only the fused kernel starts early");
  NewToken new_token;
  if (!EARLY) {
    wait_for_prior_kernels();
    if (gridDim.y <= kEarlyStartRows) start_next_kernel();  // 1-2 rows: a GEMV follows
    if constexpr (FUSED) new_token = load_new_token<T, D>(p, f, row, h);
  }
  const int new_pos = p.lengths[row] - 1;  // the new token's position (unclamped)
  const int len = min(new_pos + 1, p.max_seq);
  const int slot = p.row_slot != nullptr ? p.row_slot[row] : row;
  const bool row_ok = len >= 1 && slot >= 0 && slot < p.num_slots;
  // A window starts the row's keys at len - window: chunks wholly before it attend to nothing.
  const int start = max(split * chunk, p.window > 0 ? len - p.window : 0);
  const int end = row_ok ? min(len, split * chunk + chunk) : 0;
  // Query head h reads key/value head h / group (grouped-query attention). The head's offset
  // goes into the cache bases once, so the key loop carries no more live values than with
  // multi-head attention.
  const int kvh = p.kv_heads <= 0 ? p.heads : p.kv_heads;
  const int64_t head_stride = static_cast<int64_t>(p.max_seq) * D;      // one (slot, head)
  const int64_t slot_stride = static_cast<int64_t>(kvh) * head_stride;  // one slot
  const int64_t kv_head_off = static_cast<int64_t>(h / (p.heads / kvh)) * head_stride;
  const T* const k_cache = p.k_cache + kv_head_off;
  const T* const v_cache = p.v_cache + kv_head_off;
  const int32_t* indir =
      p.cache_indir != nullptr ? p.cache_indir + static_cast<int64_t>(row) * p.max_seq : nullptr;

  // Where key k's row sits in either cache, or -1 when k is past the chunk or its indirection
  // slot is invalid (a key's and its value's rows share the offset).
  auto row_offset = [&](int k) -> int64_t {
    if (k >= end) return -1;
    const int src = indir != nullptr ? indir[k] : slot;
    if (src < 0 || src >= p.num_slots) return -1;
    return src * slot_stride + static_cast<int64_t>(k) * D;  // from k_cache / v_cache
  };
  // This lane's vectors of a row (zeros where there is none).
  auto load_row = [&](const T* r, Row(&dst)[NV]) {
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int vi = li + n * TPK;
      dst[n] = r != nullptr && vi < NVEC ? *reinterpret_cast<const Row*>(r + vi * VEC)
                                         : make_int4(0, 0, 0, 0);
    }
  };
  // The key and value rows of the window at `base` (keys base + u * NGROUPS + g); ok[u]: key u
  // has rows. Key `skip` (the fused kernel's new token) is left out here: fill_new adds it.
  auto load_window = [&](int base, int skip, Row(&krows)[UNROLL][NV], Row(&vrows)[UNROLL][NV],
                         bool (&ok)[UNROLL]) {
    int64_t off[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = base + u * NGROUPS + g;
      off[u] = k == skip ? -1 : row_offset(k);
      ok[u] = off[u] >= 0;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) load_row(ok[u] ? k_cache + off[u] : nullptr, krows[u]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) load_row(ok[u] ? v_cache + off[u] : nullptr, vrows[u]);
  };
  // The fused kernel's new token's rows in the first window, after prepare_new_token: from the
  // block's own copies of what it wrote into the caches.
  auto fill_new = [&](Row(&krows)[UNROLL][NV], Row(&vrows)[UNROLL][NV], bool (&ok)[UNROLL],
                      const T* k_own, const T* v_own) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (start + u * NGROUPS + g == new_pos) {
        ok[u] = row_offset(new_pos) >= 0;
        load_row(ok[u] ? k_own : nullptr, krows[u]);
        load_row(ok[u] ? v_own : nullptr, vrows[u]);
      }
    }
  };
  Row k_first[UNROLL][NV], v_first[UNROLL][NV];
  bool ok_first[UNROLL];
  if (EARLY) {
    load_window(start, new_pos, k_first, v_first, ok_first);
    wait_for_prior_kernels();
    start_next_kernel();  // a GEMV follows
    new_token = load_new_token<T, D>(p, f, row, h);
  }
  if (start >= end) {  // nothing to attend to in this chunk
    if (splits == 1) {
      for (int d = threadIdx.x; d < D; d += kThreads) p.out[out_off + d] = from_float<T>(0.f);
    } else if (threadIdx.x == 0) {
      float* ws_m = p.workspace + static_cast<int64_t>(p.rows) * p.heads * splits * D;
      ws_m[part] = -INFINITY;
      ws_m[static_cast<int64_t>(p.rows) * p.heads * splits + part] = 0.f;
    }
    return;
  }

  // This lane's part of q, scaled.
  float q[NV][VEC];
  if constexpr (FUSED) {
    __shared__ float q_s[D];
    __shared__ __align__(16) T k_s[D], v_s[D];
    prepare_new_token<T, D>(p, f, new_token, new_pos, h, slot, start, end, q_s, k_s, v_s);
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int vi = li + n * TPK;
#pragma unroll
      for (int e = 0; e < VEC; ++e) q[n][e] = vi < NVEC ? q_s[vi * VEC + e] * p.scale : 0.f;
    }
    if (EARLY) fill_new(k_first, v_first, ok_first, k_s, v_s);
  } else {
#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int vi = li + n * TPK;
      if (vi < NVEC) {
        load_vec<T, VEC>(p.q + out_off + vi * VEC, q[n]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) q[n][e] *= p.scale;
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) q[n][e] = 0.f;
      }
    }
  }
  if (!EARLY) load_window(start, -1, k_first, v_first, ok_first);

  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.f;
  const int q_pos = len - 1;

  // The group's running max m_run (-inf until it meets a key), exp-sum l_run and this lane's
  // p * v sums, all relative to m_run. Every lane of a group holds the same m_run and l_run. The
  // loop bounds are uniform over the block so the shuffles stay converged.
  float m_run = -INFINITY, l_run = 0.f;
  float acc[NV][VEC];
#pragma unroll
  for (int n = 0; n < NV; ++n) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[n][e] = 0.f;
  }
  // ok[u]: key u of the window has its rows.
  auto window = [&](int base, const Row(&krows)[UNROLL][NV], const Row(&vrows)[UNROLL][NV],
                    const bool (&ok)[UNROLL]) {
    float logit[UNROLL];
    float m_new = m_run;
    // REL: lane u < UNROLL of the group loads key u's bias and the shuffles below hand it to the
    // others: one load and one live value a lane instead of UNROLL. The index is formed here from
    // the parameters, in 32 bits (the launcher checks heads x (2M + 1) < 2^31), so that no table
    // pointer stays live: with either, the unfused kernel (bounded to 64 registers) spilled. It
    // is clamped, so that keys without rows (past the chunk) read inside the table too. Read
    // after the wait, like everything the kernel ahead may write.
    float rel_mine = 0.f;
    if constexpr (REL) {
      const int m = p.bias_max_distance;
      const int d = base + min(li, UNROLL - 1) * NGROUPS + g - q_pos;  // key - query
      rel_mine = __ldg(p.position_bias + (h * (2 * m + 1) + min(max(d + m, 0), 2 * m)));
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float dot = 0.f;
#pragma unroll
      for (int n = 0; n < NV; ++n) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          dot = fmaf(q[n][e], to_float(reinterpret_cast<const T*>(&krows[u][n])[e]), dot);
        }
      }
#pragma unroll
      for (int off = TPK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const int k = base + u * NGROUPS + g;
      float lg = dot + slope * static_cast<float>(k - q_pos);
      if constexpr (REL) lg += __shfl_sync(0xffffffffu, rel_mine, u, TPK);
      logit[u] = ok[u] ? lg : -INFINITY;
      m_new = fmaxf(m_new, logit[u]);
    }
    // Shifting by 0 while no key has been met keeps exp(-inf - shift) = 0 free of a branch.
    const float shift = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = __expf(m_run - shift);  // 0 until the group meets its first key
    m_run = m_new;
    l_run *= alpha;
#pragma unroll
    for (int n = 0; n < NV; ++n) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[n][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const float pk = __expf(logit[u] - shift);  // 0 for a key without rows
      l_run += pk;
#pragma unroll
      for (int n = 0; n < NV; ++n) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          acc[n][e] = fmaf(pk, to_float(reinterpret_cast<const T*>(&vrows[u][n])[e]), acc[n][e]);
        }
      }
    }
  };
  window(start, k_first, v_first, ok_first);
  for (int base = start + WINDOW; base < end; base += WINDOW) {
    Row krows[UNROLL][NV], vrows[UNROLL][NV];
    bool ok[UNROLL];
    load_window(base, -1, krows, vrows, ok);
    window(base, krows, vrows, ok);
  }
#pragma unroll
  for (int n = 0; n < NV; ++n) {
    const int vi = li + n * TPK;
    if (vi < NVEC) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) red[g * D + vi * VEC + e] = acc[n][e];
    }
  }
  if (li == 0) {
    group_m[g] = m_run;
    group_l[g] = l_run;
  }
  __syncthreads();

  // The block's max M and exp-sum L, and each group's weight exp(group max - M): lane gi of
  // every warp takes group gi (NGROUPS <= 32), so no further barrier is needed. The warps that
  // hold output elements then add the groups' sums, weighted.
  static_assert(NGROUPS <= 32 && D <= kThreads, "a lane per group, a thread per output element");
  const int lane = threadIdx.x & 31;
  const float gm = lane < NGROUPS ? group_m[lane] : -INFINITY;
  const float m = warp_max(gm);
  const float w = __expf(gm - (m == -INFINITY ? 0.f : m));  // 0 for a group that met no key
  const float l = warp_sum(lane < NGROUPS ? w * group_l[lane] : 0.f);
  if (threadIdx.x < (D + 31) / 32 * 32) {  // whole warps: the shuffles below take every lane
    const int d = threadIdx.x;
    float sum = 0.f;
#pragma unroll
    for (int gi = 0; gi < NGROUPS; ++gi) {
      const float wg = __shfl_sync(0xffffffffu, w, gi);
      if (d < D) sum = fmaf(wg, red[gi * D + d], sum);
    }
    if (d < D && splits == 1) p.out[out_off + d] = from_float<T>(l > 0.f ? sum / l : 0.f);
    if (d < D && splits > 1) p.workspace[part * D + d] = sum;
    if (d == 0 && splits > 1) {
      float* ws_m = p.workspace + static_cast<int64_t>(p.rows) * p.heads * splits * D;
      ws_m[part] = m;
      ws_m[static_cast<int64_t>(p.rows) * p.heads * splits + part] = l;
    }
  }
}

// Merge the chunks of one (row, head): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// One block per (row, head), one thread per output dim.
template <typename T>
__global__ void decode_combine_kernel(const DecodeAttentionParams<T> p, int splits, int chunk) {
  wait_for_prior_kernels();
  if (gridDim.x <= kEarlyStartRows * p.heads) start_next_kernel();
  const int rh = blockIdx.x;  // row * heads + head
  const int row = rh / p.heads;
  const int d = threadIdx.x;
  const int D = p.head_dim;
  const int len = min(p.lengths[row], p.max_seq);
  const int used = len >= 1 ? min(splits, ceil_div(len, chunk)) : 0;
  const float* acc = p.workspace + static_cast<int64_t>(rh) * splits * D;
  const float* ws_m = p.workspace + static_cast<int64_t>(p.rows) * p.heads * splits * D +
                      static_cast<int64_t>(rh) * splits;
  const float* ws_l = ws_m + static_cast<int64_t>(p.rows) * p.heads * splits;
  float big_m = -INFINITY;
  for (int s = 0; s < used; ++s) big_m = fmaxf(big_m, ws_m[s]);
  float total_l = 0.f, total = 0.f;
  for (int s = 0; s < used; ++s) {
    const float w = attn::exp_shifted(ws_m[s], big_m);
    if (w > 0.f) {
      total_l += w * ws_l[s];
      total += w * acc[static_cast<int64_t>(s) * D + d];
    }
  }
  p.out[static_cast<int64_t>(rh) * D + d] = from_float<T>(total_l > 0.f ? total / total_l : 0.f);
}

// The kernel for one head size: unfused, fused, or fused starting early (1-2 rows).
template <typename T, int D, bool REL>
auto pick_kernel(bool fused, bool early) {
  return !fused  ? decode_attention_kernel<T, D, false, false, REL>
         : early ? decode_attention_kernel<T, D, true, true, REL>
                 : decode_attention_kernel<T, D, true, false, REL>;
}

template <typename T, int D>
cudaError_t launch_for_dim(const DecodeAttentionParams<T>& p, const DecodeQkvInputs<T>* fused,
                           int splits, cudaStream_t stream) {
  const int chunk = chunk_size(p.max_seq, splits);
  const bool early = fused != nullptr && p.rows <= kEarlyStartRows;
  auto kernel = p.position_bias == nullptr ? pick_kernel<T, D, false>(fused != nullptr, early)
                                           : pick_kernel<T, D, true>(fused != nullptr, early);
  LaunchShape shape;
  shape.grid = dim3(p.heads, p.rows, splits);
  shape.block = dim3(kThreads);
  const cudaError_t err = launch_kernel(shape, stream, kernel, p, splits, chunk,
                                        fused != nullptr ? *fused : DecodeQkvInputs<T>{});
  if (err != cudaSuccess || splits == 1) return err;
  LaunchShape combine;
  combine.grid = dim3(p.rows * p.heads);
  combine.block = dim3(D);
  return launch_kernel(combine, stream, decode_combine_kernel<T>, p, splits, chunk);
}

}  // namespace

int decode_attention_num_splits(int rows, int heads, int max_seq) {
  if (max_seq < kSplitThreshold) return 1;
  const int64_t work = static_cast<int64_t>(rows) * heads;
  return ceil_div(max_seq, work < kSmallWork ? kSmallWorkChunk : kLargeWorkChunk);
}

size_t decode_attention_workspace_bytes(int rows, int heads, int head_dim, int max_seq) {
  const int splits = decode_attention_num_splits(rows, heads, max_seq);
  if (splits <= 1 || rows <= 0 || heads <= 0) return 0;
  return static_cast<size_t>(rows) * heads * splits * (head_dim + 2) * sizeof(float);
}

namespace {

// Checks shared by both launchers; on success *splits is the key split.
template <typename T>
cudaError_t check_decode(const DecodeAttentionParams<T>& p, bool need_q, int* splits) {
  if (p.rows < 0 || p.rows > 65535 || p.heads <= 0 || p.kv_heads < 0 || p.window < 0 ||
      p.bias_max_distance < 0 || p.bias_max_distance > 65535 ||
      (p.kv_heads > 0 && p.heads % p.kv_heads != 0) || p.num_slots < 0 || p.max_seq < 0 ||
      p.out == nullptr || (need_q && p.q == nullptr) || p.k_cache == nullptr ||
      p.v_cache == nullptr || p.lengths == nullptr) {
    return cudaErrorInvalidValue;
  }
  if ((need_q && !aligned_to(p.q, 16)) || !aligned_to(p.k_cache, 16) ||
      !aligned_to(p.v_cache, 16)) {
    return cudaErrorMisalignedAddress;
  }
  // The kernel indexes position_bias in 32 bits.
  if (p.position_bias != nullptr &&
      static_cast<int64_t>(p.heads) * (2 * p.bias_max_distance + 1) > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.rows > 0 && p.max_seq == 0) return cudaErrorInvalidValue;
  *splits = p.rows == 0 ? 1 : decode_attention_num_splits(p.rows, p.heads, p.max_seq);
  if (*splits > 65535) return cudaErrorInvalidValue;
  if (*splits > 1 &&
      (p.workspace == nullptr || p.workspace_bytes < decode_attention_workspace_bytes(
                                                         p.rows, p.heads, p.head_dim, p.max_seq))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionParams<T>& p, cudaStream_t stream) {
  int splits = 1;
  const cudaError_t err = check_decode(p, true, &splits);
  if (err != cudaSuccess || p.rows == 0) return err;
  return WF_HEAD_DIM_SWITCH(p.head_dim, HEAD_DIM, [&] {
    return launch_for_dim<T, HEAD_DIM>(p, nullptr, splits, stream);
  });
}

template <typename T>
cudaError_t launch_decode_attention_fused(const DecodeAttentionFusedParams<T>& p,
                                          cudaStream_t stream) {
  int splits = 1;
  const cudaError_t err = check_decode<T>(p, false, &splits);
  if (err != cudaSuccess) return err;
  if (p.qkv == nullptr ||
      (p.rotary_style != RotaryStyle::kNone &&
       (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim ||
        (p.rotary_dim > 0 && p.rotary_inv_freq == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  const DecodeQkvInputs<T>& f = p;
  return WF_HEAD_DIM_SWITCH(p.head_dim, HEAD_DIM,
                            [&] { return launch_for_dim<T, HEAD_DIM>(p, &f, splits, stream); });
}

template cudaError_t launch_decode_attention<float>(const DecodeAttentionParams<float>&,
                                                    cudaStream_t);
template cudaError_t launch_decode_attention<__half>(const DecodeAttentionParams<__half>&,
                                                     cudaStream_t);
template cudaError_t launch_decode_attention<__nv_bfloat16>(
    const DecodeAttentionParams<__nv_bfloat16>&, cudaStream_t);
template cudaError_t launch_decode_attention_fused<float>(const DecodeAttentionFusedParams<float>&,
                                                          cudaStream_t);
template cudaError_t launch_decode_attention_fused<__half>(
    const DecodeAttentionFusedParams<__half>&, cudaStream_t);
template cudaError_t launch_decode_attention_fused<__nv_bfloat16>(
    const DecodeAttentionFusedParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

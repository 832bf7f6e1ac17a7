// Token sampler (see sampler.h for the contract and the tie rule).
//
// One block of kThreads per row. All decisions that steer the block (greedy or not, which path,
// where to stop) are taken from values broadcast through shared memory, so every
// __syncthreads() below is reached by the whole block.
//
// Order keys: a float's bit pattern mapped to a uint32 that sorts like the float (negatives
// bit-inverted, positives with the sign bit set). A token's rank is (key descending, index
// ascending); composite 64-bit keys (key << 32 | ~index) sort that way as plain integers.
//
// Paths, after pass 1 (max, argmax, softmax denominator S, number of finite logits n):
//   greedy      k == 1 (or a single finite logit)
//   candidates  the C = min(k, n) best tokens (C = min(1024, n) for top-p without top-k) are
//               found by radix select (count histograms), gathered, sorted and scanned in fp32;
//               top-p cuts that list, the draw walks it.
//   mass        top-p whose nucleus is not inside the best 1024 tokens, or plain sampling of more
//               than 1024 tokens: radix select with probability-mass histograms in 2^-40
//               fixed point (integer sums: the same bits whatever order the atomics land in),
//               then one prefix-sum pass in index order draws the token.
// Histogram updates are aggregated per warp (lanes with the same bucket add once), which keeps
// shared-memory atomics cheap when most logits share their top bits.
#include <cfloat>
#include <climits>

#include "kernels/common.cuh"
#include "kernels/sampling/philox.cuh"
#include "kernels/sampling/sampler.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 4;  // contiguous elements per thread in the draw pass
constexpr int kTile = kThreads * kItems;
constexpr int kMaxCand = kSamplerMaxTopK;
constexpr int kCandPerThread = kMaxCand / kThreads;
constexpr float kMassScale = 1099511627776.f;  // 2^40: exp(x - max) in fixed point
constexpr uint32_t kKeyNegInf = 0x007fffffu;   // order_key(-inf)
constexpr unsigned kFull = 0xffffffffu;
static_assert(kMaxCand % kThreads == 0, "candidates are scanned kCandPerThread per thread");

using u64 = unsigned long long;

struct Smem {
  u64 cand[kMaxCand];   // composite keys of the candidates, sorted descending
  float cum[kMaxCand];  // inclusive prefix sums of exp(x - max) over the sorted candidates
  int hist_count[256];
  u64 hist_mass[256];
  u64 scan_u64[kWarps + 1];
  float scan_f[kWarps + 1];
  int scan_i[kWarps + 1];
  float red_m[kWarps];
  float red_s[kWarps];
  int red_arg[kWarps];
  int red_n[kWarps];
  float max_logit;
  float denom;
  int argmax;
  int n_valid;
  int sel_bucket;
  int sel_count;
  int sel_above_count;
  u64 sel_above_mass;
  u64 sel_bucket_mass;
  u64 mass_target;
  int n_cand;
  int result;
  int result2;
  int nth;
};

// ---- element access -----------------------------------------------------------------------------
// NaN -> -inf, +inf -> FLT_MAX, -0 -> +0 (so that equal values have equal keys).
__device__ __forceinline__ float load_logit(const float* __restrict__ row, int i) {
  float x = row[i];
  if (x != x) return -INFINITY;
  x = fminf(x, FLT_MAX);
  return x == 0.f ? 0.f : x;
}

__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ u64 composite(uint32_t key, int i) {
  return (static_cast<u64>(key) << 32) | static_cast<u64>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ int composite_index(u64 c) {
  return static_cast<int>(~static_cast<uint32_t>(c & 0xffffffffull));
}

// exp(x - max) in 2^-40 fixed point (<= 2^40); 0 for -inf.
__device__ __forceinline__ u64 fixed_mass(float x, float max_logit) {
  return x > -INFINITY ? __float2ull_rn(expf(x - max_logit) * kMassScale) : 0ull;
}

// ---- block primitives ---------------------------------------------------------------------------
// Exclusive prefix sum over the block in thread order; `total` gets the block's sum. `sums` has
// kWarps + 1 entries. Starts with a barrier, so it can be called back to back.
template <typename V>
__device__ __forceinline__ V block_exclusive_scan(V v, V* sums, V& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  V incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const V o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl = incl + o;
  }
  V excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = V(0);
  __syncthreads();
  if (lane == 31) sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const V w = lane < kWarps ? sums[lane] : V(0);
    V wi = w;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const V o = __shfl_up_sync(kFull, wi, off);
      if (lane >= off) wi = wi + o;
    }
    V we = __shfl_up_sync(kFull, wi, 1);
    if (lane == 0) we = V(0);
    if (lane < kWarps) sums[lane] = we;
    if (lane == kWarps - 1) sums[kWarps] = wi;
  }
  __syncthreads();
  total = sums[kWarps];
  return sums[warp] + excl;
}

// Warp-aggregated histogram updates; every lane of the warp must call them (bucket < 0: none).
__device__ __forceinline__ void hist_add_count(int* hist, int bucket) {
  const unsigned peers = __match_any_sync(kFull, bucket);
  if (bucket >= 0 && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) {
    atomicAdd(&hist[bucket], __popc(peers));
  }
}

// q <= 2^40 is summed over the lanes of a bucket as two 20-bit halves (no 32-bit overflow for 32
// lanes) and added to the 64-bit bucket by the group's first lane.
__device__ __forceinline__ void hist_add_count_mass(int* hc, u64* hm, int bucket, u64 q) {
  const unsigned peers = __match_any_sync(kFull, bucket);
  const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(q >> 20));
  const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(q & 0xfffffull));
  if (bucket >= 0 && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) {
    atomicAdd(&hc[bucket], __popc(peers));
    atomicAdd(&hm[bucket], (static_cast<u64>(hi) << 20) + lo);
  }
}

// Called by one whole warp. Buckets are walked from 255 down; finds the bucket b with
// above(b) < want <= above(b) + hist[b], where above(b) sums the buckets over b. If `want`
// exceeds the total, the lowest bucket is returned.
template <typename V>
__device__ __forceinline__ void find_bucket(const V* hist, V want, int& bucket, V& above) {
  const int lane = threadIdx.x & 31;
  V local[8];
  V sum = V(0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    local[j] = hist[255 - (lane * 8 + j)];
    sum = sum + local[j];
  }
  V incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const V o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl = incl + o;
  }
  const V excl = incl - sum;
  const unsigned hit = __ballot_sync(kFull, excl < want && want <= incl);
  const int owner = hit ? __ffs(hit) - 1 : 31;
  int b = 0;
  V a = V(0);
  if (lane == owner) {
    V acc = excl;
    int j = 0;
    for (; j < 7; ++j) {
      if (want <= acc + local[j]) break;
      acc = acc + local[j];
    }
    b = 255 - (lane * 8 + j);
    a = acc;
  }
  bucket = __shfl_sync(kFull, b, owner);
  above = __shfl_sync(kFull, a, owner);
}

// ---- pass 1: max, argmax (lowest index), softmax denominator, finite count ----------------------
struct RowStats {
  float m, s;
  int arg, n;
};

__device__ __forceinline__ RowStats combine(const RowStats& a, const RowStats& b) {
  RowStats c;
  c.m = fmaxf(a.m, b.m);
  const float sa = a.m == -INFINITY ? 0.f : a.s * expf(a.m - c.m);
  const float sb = b.m == -INFINITY ? 0.f : b.s * expf(b.m - c.m);
  c.s = sa + sb;
  c.arg = a.m > b.m ? a.arg : (b.m > a.m ? b.arg : min(a.arg, b.arg));
  c.n = a.n + b.n;
  return c;
}

__device__ __forceinline__ RowStats warp_combine(RowStats v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    RowStats o;
    o.m = __shfl_xor_sync(kFull, v.m, off);
    o.s = __shfl_xor_sync(kFull, v.s, off);
    o.arg = __shfl_xor_sync(kFull, v.arg, off);
    o.n = __shfl_xor_sync(kFull, v.n, off);
    v = combine(v, o);
  }
  return v;
}

__device__ void row_stats(const float* __restrict__ row, int vocab, Smem& sm) {
  RowStats st{-INFINITY, 0.f, INT_MAX, 0};
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = load_logit(row, i);
    if (x > -INFINITY) {
      ++st.n;
      if (x > st.m) {  // indices grow per thread: a strict '>' keeps the lowest index of ties
        st.s = st.s * expf(st.m - x) + 1.f;
        st.m = x;
        st.arg = i;
      } else {
        st.s += expf(x - st.m);
      }
    }
  }
  st = warp_combine(st);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm.red_m[warp] = st.m;
    sm.red_s[warp] = st.s;
    sm.red_arg[warp] = st.arg;
    sm.red_n[warp] = st.n;
  }
  __syncthreads();
  if (warp == 0) {
    RowStats w{-INFINITY, 0.f, INT_MAX, 0};
    if (lane < kWarps) {
      w = RowStats{sm.red_m[lane], sm.red_s[lane], sm.red_arg[lane], sm.red_n[lane]};
    }
    w = warp_combine(w);
    if (lane == 0) {
      sm.max_logit = w.m;
      sm.denom = w.s;
      sm.argmax = w.arg;
      sm.n_valid = w.n;
    }
  }
  __syncthreads();
}

// ---- candidates path ----------------------------------------------------------------------------
// Selection of the C best tokens: {key > T} plus, when need > 0, the first `need` tokens (by index)
// whose key equals T. tie_count is the number of tokens with key T.
struct Selection {
  uint32_t T;
  int need;
  int tie_count;
};

__device__ Selection radix_select_count(const float* __restrict__ row, int vocab, int C, Smem& sm) {
  uint32_t prefix = 0, mask = 0;
  int remaining = C;
  int count = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = threadIdx.x; b < 256; b += kThreads) sm.hist_count[b] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < vocab; i0 += kThreads) {
      const int i = i0 + threadIdx.x;
      int bucket = -1;
      if (i < vocab) {
        const uint32_t key = order_key(load_logit(row, i));
        if ((key & mask) == prefix) bucket = static_cast<int>((key >> shift) & 0xffu);
      }
      hist_add_count(sm.hist_count, bucket);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      int b, above;
      find_bucket<int>(sm.hist_count, remaining, b, above);
      if (threadIdx.x == 0) {
        sm.sel_bucket = b;
        sm.sel_above_count = above;
        sm.sel_count = sm.hist_count[b];
      }
    }
    __syncthreads();
    remaining -= sm.sel_above_count;
    count = sm.sel_count;
    prefix |= static_cast<uint32_t>(sm.sel_bucket) << shift;
    mask |= 0xffu << shift;
    if (count == remaining && prefix != 0) {  // the whole bucket is in: key >= prefix
      return Selection{prefix - 1, 0, 0};
    }
  }
  return Selection{prefix, remaining, count};
}

// Index of the nth (1-based) token whose key equals T, in index order.
__device__ int find_nth_tie(const float* __restrict__ row, int vocab, uint32_t T, int nth,
                            Smem& sm) {
  if (threadIdx.x == 0) sm.nth = INT_MAX;  // published by the scan's barriers
  int carry = 0;
  for (int i0 = 0; i0 < vocab; i0 += kThreads) {
    const int i = i0 + threadIdx.x;
    const int eq = (i < vocab && order_key(load_logit(row, i)) == T) ? 1 : 0;
    int total;
    const int before = block_exclusive_scan<int>(eq, sm.scan_i, total);
    if (eq && carry + before == nth - 1) sm.nth = i;
    carry += total;
    if (carry >= nth) break;
  }
  __syncthreads();
  return sm.nth;
}

// Gathers the selection into sm.cand, sorts it best first, writes sm.cum; returns its size.
__device__ int gather_and_sort(const float* __restrict__ row, int vocab, const Selection& sel,
                               float max_logit, Smem& sm) {
  const int last_tie = (sel.need > 0 && sel.need < sel.tie_count)
                           ? find_nth_tie(row, vocab, sel.T, sel.need, sm)
                           : INT_MAX;
  if (threadIdx.x == 0) sm.n_cand = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint32_t key = order_key(load_logit(row, i));
    if (key > sel.T || (sel.need > 0 && key == sel.T && i <= last_tie)) {
      const int slot = atomicAdd(&sm.n_cand, 1);
      if (slot < kMaxCand) sm.cand[slot] = composite(key, i);
    }
  }
  __syncthreads();
  const int n = min(sm.n_cand, kMaxCand);
  int padded = 1;
  while (padded < n) padded <<= 1;
  for (int j = n + threadIdx.x; j < padded; j += kThreads) sm.cand[j] = 0ull;  // sorts last
  __syncthreads();
  // Bitonic sort, descending.
  for (int size = 2; size <= padded; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < padded; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const u64 a = sm.cand[i], b = sm.cand[j];
          const bool descending = (i & size) == 0;
          if (descending ? a < b : a > b) {
            sm.cand[i] = b;
            sm.cand[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  // Inclusive prefix sums of exp(x - max), kCandPerThread consecutive candidates per thread.
  float e[kCandPerThread];
  float local = 0.f;
  const int j0 = threadIdx.x * kCandPerThread;
#pragma unroll
  for (int t = 0; t < kCandPerThread; ++t) {
    const int j = j0 + t;
    e[t] = j < n ? expf(key_value(static_cast<uint32_t>(sm.cand[j] >> 32)) - max_logit) : 0.f;
    local += e[t];
  }
  float total;
  float acc = block_exclusive_scan<float>(local, sm.scan_f, total);
#pragma unroll
  for (int t = 0; t < kCandPerThread; ++t) {
    acc += e[t];
    if (j0 + t < n) sm.cum[j0 + t] = acc;
  }
  __syncthreads();
  return n;
}

// Block-wide min over threads of v (INT_MAX where a thread has nothing).
__device__ __forceinline__ int block_min(int v, int* slot) {
  if (threadIdx.x == 0) *slot = INT_MAX;
  __syncthreads();
  v = min(v, __shfl_xor_sync(kFull, v, 16));
  v = min(v, __shfl_xor_sync(kFull, v, 8));
  v = min(v, __shfl_xor_sync(kFull, v, 4));
  v = min(v, __shfl_xor_sync(kFull, v, 2));
  v = min(v, __shfl_xor_sync(kFull, v, 1));
  if ((threadIdx.x & 31) == 0 && v != INT_MAX) atomicMin(slot, v);
  __syncthreads();
  const int out = *slot;
  __syncthreads();  // the slot may be reused right away
  return out;
}

__device__ __forceinline__ int block_max(int v, int* slot) {
  return -block_min(v == INT_MIN ? INT_MAX : -v, slot);
}

// Top-p cut and draw over the sorted candidates. top_p_mass <= 0 disables the cut. Returns the
// chosen token.
__device__ int draw_candidates(int n, float top_p_mass, double u, Smem& sm) {
  int keep = n;
  if (top_p_mass > 0.f) {
    // first j whose exclusive prefix (mass ranked above it) reaches the target: keep [0, j)
    int first = INT_MAX;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float above = j == 0 ? 0.f : sm.cum[j - 1];
      if (above >= top_p_mass) first = min(first, j);
    }
    first = block_min(first, &sm.result);
    keep = max(1, min(first, n));
  }
  const float target = static_cast<float>(u * static_cast<double>(sm.cum[keep - 1]));
  int pick = INT_MAX;
  for (int j = threadIdx.x; j < keep; j += kThreads) {
    if (sm.cum[j] > target) pick = min(pick, j);
  }
  pick = block_min(pick, &sm.result);
  if (pick == INT_MAX) {  // rounding put the target at the very top: last token with mass
    int last = INT_MIN;
    for (int j = threadIdx.x; j < keep; j += kThreads) {
      const float below = j == 0 ? 0.f : sm.cum[j - 1];
      if (sm.cum[j] > below) last = max(last, j);
    }
    last = block_max(last, &sm.result2);
    pick = last == INT_MIN ? 0 : last;
  }
  return composite_index(sm.cand[pick]);
}

// ---- mass path ----------------------------------------------------------------------------------
// Kept set: {key > T} plus the tokens with key T and index <= last_tie. kept_mass is its total in
// fixed point.
struct MassCut {
  uint32_t T;
  int last_tie;
  u64 kept_mass;
};

__device__ MassCut radix_select_mass(const float* __restrict__ row, int vocab, float top_p,
                                     float max_logit, Smem& sm) {
  uint32_t prefix = 0, mask = 0;
  u64 mass_gt = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      sm.hist_count[b] = 0;
      sm.hist_mass[b] = 0ull;
    }
    __syncthreads();
    for (int i0 = 0; i0 < vocab; i0 += kThreads) {
      const int i = i0 + threadIdx.x;
      int bucket = -1;
      u64 q = 0;
      if (i < vocab) {
        const float x = load_logit(row, i);
        const uint32_t key = order_key(x);
        if (x > -INFINITY && (key & mask) == prefix) {
          bucket = static_cast<int>((key >> shift) & 0xffu);
          q = fixed_mass(x, max_logit);
        }
      }
      hist_add_count_mass(sm.hist_count, sm.hist_mass, bucket, q);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      if (pass == 0) {  // the first pass sees every finite token: total mass, then the target
        u64 t = 0;
        for (int b = threadIdx.x; b < 256; b += 32) t += sm.hist_mass[b];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(kFull, t, off);
        if (threadIdx.x == 0) {
          u64 target = static_cast<u64>(static_cast<double>(top_p) * static_cast<double>(t));
          target = target < 1ull ? 1ull : (target > t ? t : target);
          sm.mass_target = target;
        }
        __syncwarp();
      }
      int b;
      u64 above;
      find_bucket<u64>(sm.hist_mass, sm.mass_target - mass_gt, b, above);
      if (threadIdx.x == 0) {
        sm.sel_bucket = b;
        sm.sel_above_mass = above;
        sm.sel_count = sm.hist_count[b];
        sm.sel_bucket_mass = sm.hist_mass[b];
      }
    }
    __syncthreads();
    mass_gt += sm.sel_above_mass;
    prefix |= static_cast<uint32_t>(sm.sel_bucket) << shift;
    mask |= 0xffu << shift;
  }
  // Every token left has key == prefix, hence the same mass.
  const int ties = max(sm.sel_count, 1);
  const u64 q_tie = sm.sel_bucket_mass / static_cast<u64>(ties);
  const u64 rest = sm.mass_target > mass_gt ? sm.mass_target - mass_gt : 0ull;
  int need =
      q_tie > 0 ? static_cast<int>(min(static_cast<u64>(ties), (rest + q_tie - 1) / q_tie)) : ties;
  need = max(need, 1);
  MassCut cut;
  cut.T = prefix;
  cut.last_tie = need < ties ? find_nth_tie(row, vocab, prefix, need, sm) : INT_MAX;
  cut.kept_mass = mass_gt + static_cast<u64>(need) * q_tie;
  return cut;
}

// Total fixed-point mass of the finite tokens (plain sampling).
__device__ u64 total_mass(const float* __restrict__ row, int vocab, float max_logit, Smem& sm) {
  u64 t = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    t += fixed_mass(load_logit(row, i), max_logit);
  }
  u64 total;
  (void)block_exclusive_scan<u64>(t, sm.scan_u64, total);
  return total;
}

// Inverse-CDF draw in index order over the kept tokens.
__device__ int draw_mass(const float* __restrict__ row, int vocab, const MassCut& cut, double u,
                         float max_logit, Smem& sm) {
  if (cut.kept_mass == 0) return -1;
  u64 target = static_cast<u64>(u * static_cast<double>(cut.kept_mass));
  if (target >= cut.kept_mass) target = cut.kept_mass - 1;
  if (threadIdx.x == 0) sm.result = -1;  // published by the scan's barriers
  u64 carry = 0;
  for (int base = 0; base < vocab; base += kTile) {
    const int i0 = base + threadIdx.x * kItems;
    u64 w[kItems];
    u64 sum = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = i0 + j;
      w[j] = 0;
      if (i < vocab) {
        const float x = load_logit(row, i);
        const uint32_t key = order_key(x);
        if (key > cut.T || (key == cut.T && i <= cut.last_tie)) w[j] = fixed_mass(x, max_logit);
      }
      sum += w[j];
    }
    u64 tile_total;
    const u64 before = carry + block_exclusive_scan<u64>(sum, sm.scan_u64, tile_total);
    if (sum > 0 && before <= target && target < before + sum) {
      u64 c = before;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        c += w[j];
        if (c > target) {
          sm.result = i0 + j;
          break;
        }
      }
    }
    carry += tile_total;
    if (carry > target) break;
  }
  __syncthreads();
  return sm.result;
}

// ---- the kernel ---------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) sample_kernel(const SamplerParams p) {
  __shared__ Smem sm;
  const int r = blockIdx.x;
  const float* __restrict__ row = p.logits + static_cast<int64_t>(r) * p.logits_stride;  // [vocab]
  row_stats(row, p.vocab, sm);
  const float max_logit = sm.max_logit;
  const int n_valid = sm.n_valid;

  int k = p.top_k != nullptr ? p.top_k[r] : 1;
  k = k < 0 ? 0 : min(k, kMaxCand);
  float top_p = p.top_p != nullptr ? p.top_p[r] : 1.f;
  if (!(top_p > 0.f)) top_p = top_p != top_p ? 1.f : 0.f;  // NaN: off; <= 0: most probable only
  const bool cut_p = top_p < 1.f;

  int token = sm.argmax;
  if (n_valid > 1 && k != 1) {
    const uint64_t seed = p.seeds != nullptr ? p.seeds[r] : 0ull;
    const int64_t pos =
        static_cast<int64_t>(p.positions != nullptr ? p.positions[r] : 0) + p.position_offset;
    const double u = sampling_uniform(seed, pos);
    bool done = false;
    if (k > 0 || cut_p || n_valid <= kMaxCand) {
      const int C = min(k > 0 ? k : kMaxCand, n_valid);
      const Selection sel =
          C < n_valid ? radix_select_count(row, p.vocab, C, sm) : Selection{kKeyNegInf, 0, 0};
      const int n = gather_and_sort(row, p.vocab, sel, max_logit, sm);
      // Top-p target: a fraction of the candidates' mass under top-k, of the whole row without.
      float target = 0.f;
      bool inside = true;
      if (cut_p) {
        target = top_p * (k > 0 ? sm.cum[n - 1] : sm.denom);
        inside = k > 0 || n >= n_valid || sm.cum[n - 1] >= target;
        if (target <= 0.f) target = FLT_MIN;  // p tiny: keep the most probable token only
      }
      if (inside) {
        token = draw_candidates(n, target, u, sm);
        done = true;
      }
    }
    if (!done) {
      MassCut cut;
      if (cut_p) {
        cut = radix_select_mass(row, p.vocab, top_p, max_logit, sm);
      } else {
        cut = MassCut{kKeyNegInf, -1, total_mass(row, p.vocab, max_logit, sm)};
      }
      const int t = draw_mass(row, p.vocab, cut, u, max_logit, sm);
      if (t >= 0) token = t;
    }
  }
  if (threadIdx.x == 0) {
    if (token < 0 || token >= p.vocab) token = 0;  // all -inf: argmax stayed INT_MAX
    p.tokens[r] = token;
    if (p.log_probs != nullptr) {
      p.log_probs[r] =
          n_valid > 0 ? load_logit(row, token) - max_logit - logf(sm.denom) : -INFINITY;
    }
  }
}

}  // namespace

cudaError_t launch_sample_tokens(const SamplerParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || (p.logits_stride != 0 && p.logits_stride < p.vocab) ||
      p.tokens == nullptr || p.logits == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  sample_kernel<<<p.rows, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace warpformer

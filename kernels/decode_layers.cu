// The layers of a small decode step as one persistent kernel — see decode_layers.h.
//
// Work of a product phase: the weight [k, n] is cut into units of kCv column vectors (16 bytes
// each, so 4 x 16 = 64 contiguous bytes of a weight row) by a k-range of k / ks rows; unit u is
// column group u % groups of k-range u / groups, and block b takes units b, b + G, b + 2G, ...
// (G blocks). A block's 512 threads are kCv column vectors x 128 row lanes: thread (cv, rl)
// multiplies rows rl, rl + 128, ... of the k-range, one 16-byte weight load each, and the
// partial sums of a unit are reduced over the row lanes with shuffles and shared memory and
// stored as fp32 partials [ks][rows][n]. The loads of a phase are issued as cp.async copies into
// one of kStages shared-memory stages two phases before it runs (a thread reads back only what it
// copied, so the copies need no block barrier, only cp.async.wait_group).
//
// The grid barrier is a counter that only grows during a launch: barrier j (the end of phase j)
// is passed once it reaches (j + 1) G. A block arrives (after its block barrier and a release)
// before it issues its next copies and waits (acquire) only when it needs the phase's inputs.
// The last block to leave resets the counters for the next launch.
#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "kernels/activation_math.cuh"
#include "kernels/attention/attention_common.cuh"
#include "kernels/common.cuh"
#include "kernels/decode_layers.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kCv = 4;                       // column vectors per unit
constexpr int kRowLanes = kThreads / kCv;    // 128
constexpr int kSlots = 8;                    // 16-byte weight loads per thread and phase
constexpr int kStages = 3;                   // phases of weights in shared memory at once
constexpr int kStageBytes = kSlots * kThreads * 16;  // 64 KiB
constexpr int kPhases = 5;                   // per layer: qkv, attention, out, fc1, fc2
enum Phase { kQkv = 0, kAttn = 1, kOut = 2, kFc1 = 3, kFc2 = 4 };
constexpr int kMaxHeadDim = 256;
constexpr int kMaxKs = 4;                    // k-split of a product at most
constexpr int kMaxHidden = 4 * kThreads;     // stream_norm: four columns per thread
// A spinning block gives up (a trap: a launch error, not a hang) after about this many cycles
// (~10 s at 2 GHz); no correct launch waits a thousandth of that.
constexpr long long kSpinLimit = 20000000000LL;

// ---- asynchronous copies and the grid barrier --------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void grid_arrive(unsigned* counter, int mode) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (mode == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    } else if (mode == 1) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    } else {
      atomicAdd(counter, 1u);
    }
  }
}

__device__ __forceinline__ void cp_async_wait_depth(int d) {
  if (d <= 0) {
    cp_async_wait<0>();
  } else if (d == 1) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<2>();
  }
}

__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (static_cast<int>(load_acquire(counter) - target) < 0) {
      if (clock64() - start > kSpinLimit) __trap();
    }
  }
  __syncthreads();
}

// Data written by other blocks during the launch: read from L2 (L1 is not coherent).
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
template <typename T>
__device__ __forceinline__ float ldcg_t(const T* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  T v;
  *reinterpret_cast<unsigned short*>(&v) = bits;
  return to_float(v);
}

template <typename T>
__device__ __forceinline__ float round_t(float v) {
  return to_float(from_float<T>(v));
}

// Sum of ks partials p[0], p[stride], ... in that order, all loads issued before the adds.
__device__ __forceinline__ float sum_partials(const float* p, int ks, int64_t stride) {
  float v[kMaxKs];
#pragma unroll
  for (int i = 0; i < kMaxKs; ++i) v[i] = i < ks ? ldcg(p + i * stride) : 0.f;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxKs; ++i) {
    if (i < ks) s += v[i];
  }
  return s;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kWarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ float apply_act(Activation act, float v) {
  switch (act) {
    case Activation::kGeluErf: return activate<Activation::kGeluErf>(v);
    case Activation::kGeluTanh: return activate<Activation::kGeluTanh>(v);
    case Activation::kRelu: return activate<Activation::kRelu>(v);
    case Activation::kSilu: return activate<Activation::kSilu>(v);
    default: return v;
  }
}

// ---- the kernel's view of the step -------------------------------------------------------------
template <typename T>
struct Product {
  const T* w;
  int n, k, ks;
  float* part;  // [ks][rows][n]
};

template <typename T>
struct Work {
  float* part[4];  // per product: qkv, out, fc1, fc2
  T* attn;         // [rows, heads * head_dim]
};

template <typename T>
__device__ __forceinline__ Work<T> carve(const DecodeLayersParams<T>& p) {
  const DecodeLayersShape& s = p.shape;
  const int lh = s.heads * s.head_dim;
  const int n[4] = {3 * lh, s.hidden, s.inter, s.hidden};
  Work<T> w;
  float* f = static_cast<float*>(p.workspace);
  for (int i = 0; i < 4; ++i) {
    w.part[i] = f;
    f += static_cast<int64_t>(p.plan.ks[i]) * p.rows * n[i];
  }
  w.attn = reinterpret_cast<T*>(f);
  return w;
}

// The product of layer phase `ph` (not kAttn).
template <typename T>
__device__ __forceinline__ Product<T> product_of(const DecodeLayersParams<T>& p, const Work<T>& wk,
                                                 const DecodeLayerWeights<T>& lw, int ph) {
  const DecodeLayersShape& s = p.shape;
  const int lh = s.heads * s.head_dim;
  switch (ph) {
    case kQkv: return {lw.qkv_w, 3 * lh, s.hidden, p.plan.ks[0], wk.part[0]};
    case kOut: return {lw.dense_w, s.hidden, lh, p.plan.ks[1], wk.part[1]};
    case kFc1: return {lw.fc1_w, s.inter, s.hidden, p.plan.ks[2], wk.part[2]};
    default: return {lw.fc2_w, s.hidden, s.inter, p.plan.ks[3], wk.part[3]};
  }
}

template <typename T>
__device__ __forceinline__ int4* stage_of(unsigned char* smem, int phase_index) {
  return reinterpret_cast<int4*>(smem + (phase_index % kStages) * kStageBytes);
}

// Issues the copies of phase j's weights (one group, empty for attention phases and past the end).
template <typename T>
__device__ void issue_weights(const DecodeLayersParams<T>& p, const Work<T>& wk, int j,
                              unsigned char* smem) {
  if (j < p.shape.layers * kPhases && j % kPhases != kAttn) {
    constexpr int V = 16 / sizeof(T);
    const DecodeLayerWeights<T> lw = p.layers[j / kPhases];
    const Product<T> pr = product_of(p, wk, lw, j % kPhases);
    int4* buf = stage_of<T>(smem, j);
    const int groups = pr.n / (kCv * V), kc = pr.k / pr.ks, per = kc / kRowLanes;
    const int cv = threadIdx.x % kCv, rl = threadIdx.x / kCv;
    int s = 0;
    for (int u = blockIdx.x; u < groups * pr.ks; u += gridDim.x) {
      const int g = u % groups, kp = u / groups;
      const T* src = pr.w + static_cast<int64_t>(kp * kc + rl) * pr.n + (g * kCv + cv) * V;
      for (int q = 0; q < per; ++q, ++s) {
        cp_async16(buf + s * kThreads + threadIdx.x, src + static_cast<int64_t>(q) * kRowLanes * pr.n);
      }
    }
  }
  cp_async_commit();
}

// One product phase: the block's units, inputs from `input(m, row)` (fp32, already rounded as
// the product's input), weights from the phase's stage. red: [kWarps][kCv * M * V] floats.
template <typename T, int M, typename Input>
__device__ void run_product(const Product<T>& pr, const int4* buf, float* red, Input input) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kUnitOut = kCv * M * V;
  const int groups = pr.n / (kCv * V), kc = pr.k / pr.ks, per = kc / kRowLanes;
  const int rl = threadIdx.x / kCv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int s = 0;
  for (int u = blockIdx.x; u < groups * pr.ks; u += gridDim.x) {
    const int g = u % groups, kp = u / groups;
    const int row0 = kp * kc + rl;
    float xin[M][kSlots];
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
#pragma unroll
      for (int m = 0; m < M; ++m) xin[m][q] = q < per ? input(m, row0 + q * kRowLanes) : 0.f;
    }
    float acc[M][V];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc[m][e] = 0.f;
    }
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      if (q < per) {
        const int4 raw = buf[(s + q) * kThreads + threadIdx.x];
        const T* w = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float wf = to_float(w[e]);
#pragma unroll
          for (int m = 0; m < M; ++m) acc[m][e] = fmaf(wf, xin[m][q], acc[m][e]);
        }
      }
    }
    s += per;
    // Lanes of one column vector: cv, cv + 4, ..., cv + 28 of the warp.
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float v = acc[m][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < kCv) red[warp * kUnitOut + (lane * M + m) * V + e] = v;
      }
    }
    __syncthreads();
    if (threadIdx.x < kUnitOut) {
      const int c = threadIdx.x % (kCv * V), m = threadIdx.x / (kCv * V);
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w * kUnitOut + ((c / V) * M + m) * V + c % V];
      pr.part[(static_cast<int64_t>(kp) * M + m) * pr.n + g * kCv * V + c] = sum;
    }
    __syncthreads();
  }
}

// A thread's four columns (4t .. 4t + 3) of the bias added to the stream and of the norm's gamma
// and beta, loaded before the phase's barrier (weights are not written during the launch).
struct NormVecs {
  float bias[4], gamma[4], beta[4];
  bool has_bias = false, has_gamma = false, has_beta = false;
};

template <typename T>
__device__ __forceinline__ void load4(const T* src, int c, float (&dst)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src + c);
  const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) dst[e] = to_float(t[e]);
}

template <typename T>
__device__ __forceinline__ NormVecs load_norm_vecs(const T* bias, const T* gamma, const T* beta,
                                                   int h) {
  NormVecs v;
  const int c = threadIdx.x * 4;
  v.has_bias = bias != nullptr;
  v.has_gamma = gamma != nullptr;
  v.has_beta = gamma != nullptr && beta != nullptr;
  if (c < h) {
    if (v.has_bias) load4(bias, c, v.bias);
    if (v.has_gamma) load4(gamma, c, v.gamma);
    if (v.has_beta) load4(beta, c, v.beta);
  }
  return v;
}

// The residual stream of rows [M, h]: x_in + round(sum of the ks partials) (+ bias), in the adds'
// order of the norms kernel (norm::load_x: delta + bias + residual); block 0 writes it rounded
// to x_out (when given). Then xs [M][h] = round(norm(stream)) with gamma / beta (gamma null:
// round(stream)), written by block 0 to n_out when given. Thread t owns columns 4t .. 4t + 3
// (h <= 4 kThreads) and issues all its loads before using any, so the phase waits for one trip
// to L2, not one per partial.
template <typename T, int M>
__device__ void stream_norm(const T* x_in, const float* part, int ks, const NormVecs& nv,
                            float eps, int h, T* x_out, T* n_out, float* xs, float* scratch) {
  const bool writer = blockIdx.x == 0;
  const int c = threadIdx.x * 4;
  const bool mine = c < h;
  uint2 xr[M];
  float4 pp[M][kMaxKs];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (mine) xr[m] = __ldcg(reinterpret_cast<const uint2*>(x_in + m * h + c));
#pragma unroll
    for (int kp = 0; kp < kMaxKs; ++kp) {
      if (mine && part != nullptr && kp < ks) {
        pp[m][kp] = __ldcg(reinterpret_cast<const float4*>(part + (kp * M + m) * h + c));
      }
    }
  }
  float v[M][4];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (!mine) continue;
    const T* xt = reinterpret_cast<const T*>(&xr[m]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[m][e] = to_float(xt[e]);
      if (part != nullptr) {
        float d = 0.f;
#pragma unroll
        for (int kp = 0; kp < kMaxKs; ++kp) {
          if (kp < ks) d += reinterpret_cast<const float*>(&pp[m][kp])[e];
        }
        d = round_t<T>(d);
        if (nv.has_bias) d += nv.bias[e];
        v[m][e] = d + v[m][e];
      }
      xs[m * h + c + e] = v[m][e];
    }
    if (writer && x_out != nullptr) store_vec<T, 4>(x_out + m * h + c, v[m]);
  }
  __syncthreads();
  const float inv_n = 1.f / static_cast<float>(h);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float mean = 0.f, rstd = 1.f;
    if (nv.has_gamma) {
      const float shift = xs[m * h];
      float sum = 0.f;
      if (mine) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sum += v[m][e] - shift;
      }
      mean = __fmaf_rn(block_sum(sum, scratch), inv_n, shift);
      float sq = 0.f;
      if (mine) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = __fsub_rn(v[m][e], mean);
          sq = __fmaf_rn(d, d, sq);
        }
      }
      rstd = rsqrtf(__fmaf_rn(block_sum(sq, scratch), inv_n, eps));
    }
    if (mine) {
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        y[e] = v[m][e];
        if (nv.has_gamma) {
          y[e] = __fmul_rn(__fmul_rn(__fsub_rn(y[e], mean), rstd), nv.gamma[e]);
          if (nv.has_beta) y[e] = __fadd_rn(y[e], nv.beta[e]);
        }
        y[e] = round_t<T>(y[e]);
        xs[m * h + c + e] = y[e];
      }
      if (writer && n_out != nullptr) store_vec<T, 4>(n_out + m * h + c, y);
    }
  }
  __syncthreads();
}

// Before the attention phase's barrier: asks L2 for the keys and values the block's (row, head)
// units will read (positions before the new token's, written by earlier steps), so that they
// arrive while the QKV product finishes. Rows read through a beam indirection are left out.
template <typename T, int M>
__device__ void prefetch_kv(const DecodeLayersParams<T>& p, int l) {
  const int heads = p.shape.heads, hd = p.shape.head_dim;
  const int64_t head_stride = static_cast<int64_t>(p.max_seq) * hd;
  const T* kc = p.kv + (2 * static_cast<int64_t>(l)) * p.layer_kv;
  for (int u = blockIdx.x; u < M * heads; u += gridDim.x) {
    const int r = u / heads, hh = u % heads;
    const int len = min(p.lengths[r], p.max_seq);
    const int slot = p.row_slot != nullptr ? p.row_slot[r] : r;
    if (p.cache_indir != nullptr || len < 2 || slot < 0 || slot >= p.num_slots) continue;
    const T* base = kc + (static_cast<int64_t>(slot) * heads + hh) * head_stride;
    const int lines = ((len - 1) * hd * static_cast<int>(sizeof(T)) + 127) / 128;
    for (int i = threadIdx.x; i < 2 * lines; i += kThreads) {
      const T* ptr = base + (i >= lines ? p.layer_kv : 0) +
                     static_cast<int64_t>(i % lines) * (128 / static_cast<int>(sizeof(T)));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
    }
  }
}

// Attention phase of layer l: every (row, head) unit of the block. `scratch` is the phase's
// stage (probabilities, then the P.V partial sums), qkv_s 3 * head_dim floats. Loads are issued
// in batches of kBatch per thread before their first use.
template <typename T, int M>
__device__ void attention_phase(const DecodeLayersParams<T>& p, const Work<T>& wk, int l,
                                const T* qkv_b, float* scratch, float* qkv_s, float* red) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kBatch = 4;
  const int heads = p.shape.heads, hd = p.shape.head_dim, lh = heads * hd;
  const int64_t head_stride = static_cast<int64_t>(p.max_seq) * hd;
  T* kc = p.kv + (2 * static_cast<int64_t>(l)) * p.layer_kv;
  T* vc = kc + p.layer_kv;
  const int rot_half = p.rotary_dim / 2;
  const bool interleaved = p.rotary_style == RotaryStyle::kInterleaved;
  float* probs = scratch;
  float* pv = scratch + ((p.max_seq + 3) & ~3);  // [kThreads / (hd / V)][hd]
  const int nv = hd / V;                         // threads per key / column vectors of a row
  const int per_pass = kThreads / nv;            // keys per pass, position slices for P.V
  const int dv = threadIdx.x % nv, sl = threadIdx.x / nv;
  for (int u = blockIdx.x; u < M * heads; u += gridDim.x) {
    const int r = u / heads, hh = u % heads;
    T* out = wk.attn + static_cast<int64_t>(r) * lh + hh * hd;
    const int len = p.lengths[r];
    const int slot = p.row_slot != nullptr ? p.row_slot[r] : r;
    if (len < 1 || slot < 0 || slot >= p.num_slots) {
      for (int d = threadIdx.x; d < hd; d += kThreads) out[d] = from_float<T>(0.f);
      continue;
    }
    const int pos = len - 1;
    const int L = min(len, p.max_seq);
    // q, k, v of the head: the product rounded to T, plus the bias, in fp32.
    for (int d = threadIdx.x; d < 3 * hd; d += kThreads) {
      const int col = (d / hd) * lh + hh * hd + d % hd;
      float v = round_t<T>(sum_partials(wk.part[0] + static_cast<int64_t>(r) * 3 * lh + col,
                                        p.plan.ks[0], static_cast<int64_t>(M) * 3 * lh));
      if (qkv_b != nullptr) v += to_float(qkv_b[col]);
      qkv_s[d] = v;
    }
    __syncthreads();
    if (rot_half > 0) {
      for (int j = threadIdx.x; j < 2 * rot_half; j += kThreads) {
        const int which = j / rot_half, i = j % rot_half;  // q, then k
        int a, b;
        attn::rotary_pair(i, rot_half, interleaved, a, b);
        const float angle = static_cast<float>(pos) * p.rotary_inv_freq[i];
        float sn, cs;
        sincosf(angle, &sn, &cs);
        float* base = qkv_s + which * hd;
        float oa, ob;
        attn::rotate(base[a], base[b], cs, sn, oa, ob);
        base[a] = oa;
        base[b] = ob;
      }
      __syncthreads();
    }
    const int64_t new_off = (static_cast<int64_t>(slot) * heads + hh) * head_stride +
                            static_cast<int64_t>(pos) * hd;
    for (int d = threadIdx.x; d < 3 * hd; d += kThreads) {
      const T v = from_float<T>(qkv_s[d]);
      qkv_s[d] = d < hd ? to_float(v) * p.scale : to_float(v);  // q pre-scaled, as decode attention
      if (d >= hd && pos < p.max_seq) (d < 2 * hd ? kc : vc)[new_off + d % hd] = v;
    }
    __syncthreads();
    const int32_t* indir =
        p.cache_indir != nullptr ? p.cache_indir + static_cast<int64_t>(r) * p.max_seq : nullptr;
    auto source = [&](int t) { return indir != nullptr ? indir[t] : slot; };
    auto row_at = [&](const T* cache, int src, int t) {
      return cache + (static_cast<int64_t>(src) * heads + hh) * head_stride +
             static_cast<int64_t>(t) * hd + dv * V;
    };
    // Scores: nv threads per key, one 16-byte piece each, a shuffle sum over the nv.
    const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[hh] : 0.f;
    float qv[V];
#pragma unroll
    for (int e = 0; e < V; ++e) qv[e] = qkv_s[dv * V + e];
    float mx = -INFINITY;
    // Up to kBatch * per_pass positions, each thread's values (the same positions and column
    // vector as its keys) are loaded with the keys and kept for P.V.
    const bool one_batch = L <= kBatch * per_pass;
    int4 vraw[kBatch];
    for (int t0 = 0; t0 < L; t0 += kBatch * per_pass) {
      int4 raw[kBatch];
      bool ok[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int t = t0 + i * per_pass + sl;
        const int src = t < L ? source(t) : -1;
        ok[i] = sl < per_pass && src >= 0 && src < p.num_slots;
        if (ok[i]) {
          raw[i] = __ldcg(reinterpret_cast<const int4*>(row_at(kc, src, t)));
          if (one_batch) vraw[i] = __ldcg(reinterpret_cast<const int4*>(row_at(vc, src, t)));
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int t = t0 + i * per_pass + sl;
        float dot = 0.f;
        if (ok[i]) {
          const T* kv = reinterpret_cast<const T*>(&raw[i]);
#pragma unroll
          for (int e = 0; e < V; ++e) dot = fmaf(qv[e], to_float(kv[e]), dot);
        }
        for (int off = nv / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (dv == 0 && sl < per_pass && t < L) {
          const float s = ok[i] ? dot + slope * static_cast<float>(t - pos) : -INFINITY;
          probs[t] = s;
          mx = fmaxf(mx, s);
        }
      }
    }
    mx = block_max(mx, red);
    float sum = 0.f;
    for (int t = threadIdx.x; t < L; t += kThreads) {
      const float e = attn::exp_shifted(probs[t], mx);
      probs[t] = e;
      sum += e;
    }
    sum = block_sum(sum, red);  // its leading barrier also publishes probs
    __syncthreads();
    // P.V: thread = (column vector dv, position slice sl).
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.f;
    if (sl < per_pass && one_batch) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int t = i * per_pass + sl;
        const float w = t < L ? probs[t] : 0.f;
        if (w == 0.f) continue;
        const T* vv = reinterpret_cast<const T*>(&vraw[i]);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = fmaf(w, to_float(vv[e]), acc[e]);
      }
    } else if (sl < per_pass) {
      for (int t0 = sl; t0 < L; t0 += kBatch * per_pass) {
        int4 raw[kBatch];
        float w[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int t = t0 + i * per_pass;
          w[i] = t < L ? probs[t] : 0.f;
          if (w[i] != 0.f) raw[i] = __ldcg(reinterpret_cast<const int4*>(row_at(vc, source(t), t)));
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (w[i] == 0.f) continue;
          const T* vv = reinterpret_cast<const T*>(&raw[i]);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = fmaf(w[i], to_float(vv[e]), acc[e]);
        }
      }
    }
    if (sl < per_pass) {
#pragma unroll
      for (int e = 0; e < V; ++e) pv[sl * hd + dv * V + e] = acc[e];
    }
    __syncthreads();
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int d = threadIdx.x; d < hd; d += kThreads) {
      float o = 0.f;
      for (int s2 = 0; s2 < per_pass; ++s2) o += pv[s2 * hd + d];
      out[d] = from_float<T>(o * inv);
    }
    __syncthreads();
  }
}

template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 1) decode_layers_kernel(const DecodeLayersParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kWarps * kCv * M * (16 / sizeof(T))];
  __shared__ float qkv_s[3 * kMaxHeadDim];
  const DecodeLayersShape& s = p.shape;
  const int h = s.hidden, lh = s.heads * s.head_dim;
  float* xs = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [M][h]
  const Work<T> wk = carve(p);
  const int total = s.layers * kPhases;
  unsigned* counter = p.barrier;
  unsigned passed = 0;  // barriers this block has passed

  const int depth = p.experiment_depth;
  for (int j = 0; j <= depth; ++j) issue_weights(p, wk, j, smem);
  T* stream[2] = {p.x, p.y};

  for (int j = 0; j < total; ++j) {
    const int l = j / kPhases, ph = j % kPhases;
    const DecodeLayerWeights<T> lw = p.layers[l];
    cp_async_wait_depth(depth);  // this phase's weights (this thread's copies) have landed
    NormVecs nvec;
    if (ph == kQkv) {
      nvec = load_norm_vecs(l == 0 ? nullptr : p.layers[l - 1].fc2_b, lw.ln1_w, lw.ln1_b, h);
    } else if (ph == kFc1) {
      nvec = load_norm_vecs(lw.dense_b, lw.ln2_w, lw.ln2_b, h);
    } else if (ph == kAttn) {
      prefetch_kv<T, M>(p, l);
    }
    if (j > 0) grid_wait(counter, ++passed * gridDim.x);
    const int4* buf = stage_of<T>(smem, j);
    if (ph == kQkv) {
      // stream = x + o + b2 of the previous layer (layer 0: the embeddings), into stream[1].
      const bool first = l == 0;
      stream_norm<T, M>(stream[0], first ? nullptr : wk.part[3], p.plan.ks[3], nvec, p.eps, h,
                        stream[1], nullptr, xs, red);
      run_product<T, M>(product_of(p, wk, lw, kQkv), buf, red,
                        [&](int m, int row) { return xs[m * h + row]; });
    } else if (ph == kAttn) {
      attention_phase<T, M>(p, wk, l, lw.qkv_b, reinterpret_cast<float*>(smem + (j % kStages) * kStageBytes),
                            qkv_s, red);
    } else if (ph == kOut) {
      const T* a = wk.attn;
      run_product<T, M>(product_of(p, wk, lw, kOut), buf, red,
                        [&](int m, int row) { return ldcg_t(a + m * lh + row); });
    } else if (ph == kFc1) {
      stream_norm<T, M>(stream[1], wk.part[1], p.plan.ks[1], nvec, p.eps, h, stream[0], nullptr,
                        xs, red);
      run_product<T, M>(product_of(p, wk, lw, kFc1), buf, red,
                        [&](int m, int row) { return xs[m * h + row]; });
    } else {
      const float* f = wk.part[2];
      const int ks = p.plan.ks[2], inter = s.inter;
      const T* b1 = lw.fc1_b;
      const Activation act = p.act;
      run_product<T, M>(product_of(p, wk, lw, kFc2), buf, red, [&](int m, int row) {
        float v = sum_partials(f + m * inter + row, ks, static_cast<int64_t>(M) * inter);
        if (b1 != nullptr) v += to_float(b1[row]);
        return round_t<T>(apply_act(act, v));
      });
    }
    grid_arrive(counter, p.experiment_sync);
    issue_weights(p, wk, j + depth + 1, smem);
  }
  cp_async_wait<0>();
  const NormVecs final_vecs =
      blockIdx.x == 0 ? load_norm_vecs(p.layers[s.layers - 1].fc2_b, p.final_gamma, p.final_beta, h)
                      : NormVecs{};
  grid_wait(counter, ++passed * gridDim.x);
  start_next_kernel();
  if (blockIdx.x == 0) {
    // The stream after the last layer, materialised in x, and final(x) into n_out.
    stream_norm<T, M>(stream[0], wk.part[3], p.plan.ks[3], final_vecs, p.eps, h, stream[0],
                      p.n_out, xs, red);
  }
  // Leave the counters zero: the last block out resets them (every block has passed every wait).
  if (threadIdx.x == 0) {
    if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
      atomicExch(counter, 0u);
      atomicExch(counter + 1, 0u);
    }
  }
}

size_t smem_bytes(const DecodeLayersShape& s, int rows) {
  return static_cast<size_t>(kStages) * kStageBytes + static_cast<size_t>(rows) * s.hidden * 4;
}

// k-split of a [k, n] product: the fewest bytes for the busiest block, then the smallest split.
int choose_split(int n, int k, int V, int blocks) {
  const int groups = n / (kCv * V);
  int best = 0;
  int64_t best_cost = 0;
  for (int ks = 1; ks <= kMaxKs; ks *= 2) {
    if (k % (ks * kRowLanes) != 0) break;
    const int units = groups * ks;
    const int per_block = (units + blocks - 1) / blocks;
    const int slots = per_block * (k / ks / kRowLanes);
    if (slots > kSlots) continue;
    const int64_t cost = static_cast<int64_t>(per_block) * (k / ks);
    if (best == 0 || cost < best_cost) {
      best = ks;
      best_cost = cost;
    }
  }
  return best;
}

// Allows the kernel `smem` bytes of dynamic shared memory on the current device and checks that
// one block fits an SM.
template <typename T, int M>
bool configure(size_t smem) {
  auto kernel = decode_layers_kernel<T, M>;
  int blocks = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem) !=
          cudaSuccess) {
    cudaGetLastError();  // a failed query must not surface in a later launch's check
    return false;
  }
  return blocks >= 1;
}

template <typename T, int M>
cudaError_t launch_rows(const DecodeLayersParams<T>& p, cudaStream_t stream) {
  auto kernel = decode_layers_kernel<T, M>;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.plan.blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = p.plan.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

}  // namespace

DecodeLayersPlan decode_layers_plan(const DecodeLayersShape& s, int device) {
  DecodeLayersPlan plan;
  if (s.elem_bytes != 2) {
    plan.why = "16-bit types only";
    return plan;
  }
  const int V = 16 / s.elem_bytes;
  const int lh = s.heads * s.head_dim;
  if (s.layers < 1 || s.hidden < 1 || s.heads < 1 || s.inter < 1) {
    plan.why = "empty model";
    return plan;
  }
  const int nv = s.head_dim / V;  // threads per key in the attention: a power of two <= 32
  if (s.head_dim % V != 0 || s.head_dim > kMaxHeadDim || (nv & (nv - 1)) != 0) {
    plan.why = "head_dim must be a power of two from 8 to 256";
    return plan;
  }
  if (s.hidden > kMaxHidden) {
    plan.why = "hidden must be at most 2048";
    return plan;
  }
  const int col_unit = kCv * V;
  if (s.hidden % col_unit != 0 || lh % col_unit != 0 || s.inter % col_unit != 0) {
    plan.why = "hidden, heads * head_dim and inter must be multiples of 32";
    return plan;
  }
  if (s.hidden % kRowLanes != 0 || lh % kRowLanes != 0 || s.inter % kRowLanes != 0) {
    plan.why = "hidden, heads * head_dim and inter must be multiples of 128";
    return plan;
  }
  const DeviceCaps caps = device_caps(device);
  int optin = 0;
  if (caps.sms < 1 || caps.major < 8 ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();
    plan.why = "needs an sm_80+ device";
    return plan;
  }
  plan.blocks = caps.sms;
  const int n[4] = {3 * lh, s.hidden, s.inter, s.hidden};
  const int k[4] = {s.hidden, lh, s.hidden, s.inter};
  for (int i = 0; i < 4; ++i) {
    plan.ks[i] = choose_split(n[i], k[i], V, plan.blocks);
    if (plan.ks[i] == 0) {
      plan.why = "a product's share per block exceeds one shared-memory stage";
      return plan;
    }
  }
  // Static shared memory: red (kWarps x kCv x rows x V floats) and qkv_s, plus the block_sum
  // scratch the compiler places with them; leave 8 KiB for it.
  plan.smem = smem_bytes(s, kDecodeLayersMaxRows);
  if (plan.smem + 8 * 1024 > static_cast<size_t>(optin)) {
    plan.why = "the hidden rows do not fit shared memory";
    return plan;
  }
  // Set once here, at model set-up (the launches may be captured into a CUDA graph).
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    plan.why = "cannot select the device";
    return plan;
  }
  const bool fits = configure<__half, 1>(plan.smem) && configure<__half, 2>(plan.smem) &&
                    configure<__nv_bfloat16, 1>(plan.smem) &&
                    configure<__nv_bfloat16, 2>(plan.smem);
  cudaSetDevice(prev);
  if (!fits) {
    plan.why = "one block per SM does not fit";
    return plan;
  }
  // The attention's scratch in its stage: probabilities, then kThreads x V floats of P.V sums.
  plan.max_seq = (kStageBytes / 4 - kThreads * V) & ~3;
  plan.ok = true;
  return plan;
}

size_t decode_layers_workspace_bytes(const DecodeLayersPlan& plan, const DecodeLayersShape& s,
                                     int rows) {
  const int64_t lh = static_cast<int64_t>(s.heads) * s.head_dim;
  const int64_t n[4] = {3 * lh, s.hidden, s.inter, s.hidden};
  size_t bytes = 0;
  for (int i = 0; i < 4; ++i) bytes += static_cast<size_t>(plan.ks[i]) * rows * n[i] * 4;
  return bytes + static_cast<size_t>(rows) * lh * s.elem_bytes;
}

template <typename T>
cudaError_t launch_decode_layers(const DecodeLayersParams<T>& p, cudaStream_t stream) {
  const DecodeLayersShape& s = p.shape;
  if (!p.plan.ok || s.elem_bytes != static_cast<int>(sizeof(T)) || p.rows < 1 ||
      p.rows > kDecodeLayersMaxRows || p.max_seq < 1 || p.max_seq > p.plan.max_seq ||
      p.layers == nullptr || p.x == nullptr || p.y == nullptr || p.n_out == nullptr ||
      p.kv == nullptr || p.lengths == nullptr || p.workspace == nullptr ||
      p.barrier == nullptr || p.num_slots < 1 ||
      (p.rotary_dim > 0 && (p.rotary_inv_freq == nullptr || p.rotary_dim % 2 != 0 ||
                            p.rotary_dim > s.head_dim))) {
    return cudaErrorInvalidValue;
  }
  static const int knobs = [] {
    const char* e = std::getenv("WARPFORMER_DL_EXPERIMENT");
    return e != nullptr ? std::atoi(e) : 2;  // tens: sync mode, ones: depth
  }();
  DecodeLayersParams<T> q = p;
  q.experiment_sync = knobs / 10;
  q.experiment_depth = knobs % 10;
  return p.rows == 1 ? launch_rows<T, 1>(q, stream) : launch_rows<T, 2>(q, stream);
}

template cudaError_t launch_decode_layers<__half>(const DecodeLayersParams<__half>&, cudaStream_t);
template cudaError_t launch_decode_layers<__nv_bfloat16>(const DecodeLayersParams<__nv_bfloat16>&,
                                                         cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

// Beam search kernels (see beam_search.h for the algorithm and the state):
//   init      one block per row: prompt, cache indirection, generation state
//   stage 1   one block per (row, vocab split): the split's top-K of cum + log_prob, K = 2W, kept
//             by each thread in a sorted register list, then merged by K block-wide argmax rounds
//   stage 2   one block per batch entry: per row (one warp each) merge of its split lists, the
//             diversity penalty, the entry's top K by counting ranks, then HF's running/finished
//             bookkeeping (small, on few threads) and the copy of new hypotheses
//   update    one block per batch entry: in-place gather of the parents' rows in column chunks
//             (every read of a chunk completes before any write)
//   finalize  one block per batch entry
// Every ordering is total — (value desc, index asc) — so results do not depend on scheduling.
// The scores are formed with explicit _rn intrinsics so that no multiply-add is contracted and the
// rounding equals PyTorch's fp32 ops in tests/_beam_reference.py.
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/sampling/argmax.cuh"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kStage1Threads = 128;
constexpr int kRowThreads = 256;      // init, update, finalize
constexpr int kMaxSplits = 32;        // one lane per split in the row merge
constexpr int kMinSplitVocab = 2048;  // smallest vocabulary chunk worth its own block
constexpr int kTargetBlocks = 528;    // about 4 blocks per SM on an H100 / H200
constexpr int kMaxK = 2 * kMaxBeamWidth;
// An empty candidate slot is (-INFINITY, kSentinelIdx), the pair block_best pads with.
constexpr int kSentinelIdx = argmax::kNoIndex;

using argmax::better;
using argmax::block_best;
using argmax::warp_best;

// n^lp as HF forms it (Python int ** float in double), rounded to fp32 like a Python scalar
// operand of an fp32 tensor op.
__device__ __forceinline__ float length_denominator(int n, double length_penalty) {
  return static_cast<float>(pow(static_cast<double>(n), length_penalty));
}

__device__ __forceinline__ const float* log_prob_row(const BeamStepParams& p, int b, int k) {
  const int64_t row = p.shared_rows ? b : static_cast<int64_t>(b) * p.s.beam + k;
  return p.log_probs + row * p.log_probs_stride;
}

// ---- init ---------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kRowThreads)
    beam_init_kernel(const BeamSearchState s, const int32_t* __restrict__ input_ids,
                     int64_t input_stride, bool shared_prompt_slot) {
  const int r = blockIdx.x;
  const int b = r / s.beam, k = r % s.beam;
  const int len = s.input_lengths[b];
  const int32_t end_id = s.end_ids[b];
  const int32_t* prompt = input_ids + static_cast<int64_t>(b) * input_stride;
  int32_t* ids = s.output_ids + static_cast<int64_t>(r) * s.ids_stride;
  for (int p = threadIdx.x; p < s.ids_stride; p += blockDim.x)
    ids[p] = p < len ? prompt[p] : end_id;
  const int32_t prompt_slot = shared_prompt_slot ? b * s.beam : r;
  int32_t* indir = s.cache_indir + static_cast<int64_t>(r) * s.indir_stride;
  for (int p = threadIdx.x; p < s.indir_stride; p += blockDim.x)
    indir[p] = p < len ? prompt_slot : r;
  if (s.run_log_probs != nullptr) {
    float* lp = s.run_log_probs + static_cast<int64_t>(r) * s.max_out;
    for (int p = threadIdx.x; p < s.max_out; p += blockDim.x) lp[p] = 0.f;
  }
  if (threadIdx.x == 0) {
    s.cur_pos[r] = len - 1;
    s.attn_len[r] = len;
    s.cum_log_probs[r] = k == 0 ? 0.f : kBeamImpossible;
    s.parents[r] = k;
    s.tokens[r] = len > 0 ? prompt[len - 1] : end_id;
    s.token_log_probs[r] = 0.f;
    if (k == 0) {
      s.gen_len[b] = 0;
      s.done[b] = 0;
      s.hyp_count[b] = 0;
    }
  }
}

// ---- stage 1: per (row, split) top K ------------------------------------------------------------
template <int MAX_K>
__global__ void __launch_bounds__(kStage1Threads)
    beam_stage1_kernel(const BeamStepParams p, int K, int splits, float* __restrict__ ws_val,
                       int* __restrict__ ws_idx) {
  const int row = blockIdx.x, split = blockIdx.y;
  const int b = row / p.s.beam, k = row % p.s.beam;
  if (p.s.done[b]) return;  // stage 2 ignores the candidates of a done entry
  const float cum = p.s.cum_log_probs[row];
  const float* src = log_prob_row(p, b, k);
  const int chunk = ceil_div(p.vocab, splits);
  const int lo = split * chunk;
  const int hi = min(p.vocab, lo + chunk);

  float v[MAX_K];
  int id[MAX_K];
#pragma unroll
  for (int j = 0; j < MAX_K; ++j) {
    v[j] = -INFINITY;
    id[j] = kSentinelIdx;
  }
  for (int t = lo + threadIdx.x; t < hi; t += blockDim.x) {
    float x = cum + src[t];
    if (x != x) x = -INFINITY;  // NaN never wins
    if (better(x, t, v[MAX_K - 1], id[MAX_K - 1])) {
      v[MAX_K - 1] = x;
      id[MAX_K - 1] = t;
#pragma unroll
      for (int j = MAX_K - 1; j > 0; --j) {
        if (better(v[j], id[j], v[j - 1], id[j - 1])) {
          const float tv = v[j];
          v[j] = v[j - 1];
          v[j - 1] = tv;
          const int ti = id[j];
          id[j] = id[j - 1];
          id[j - 1] = ti;
        }
      }
    }
  }

  __shared__ float sv[argmax::kBlockScratch];
  __shared__ int si[argmax::kBlockScratch];
  const int64_t out = (static_cast<int64_t>(row) * splits + split) * K;
  for (int j = 0; j < K; ++j) {
    float bv = v[0];
    int bi = id[0];
    block_best(bv, bi, sv, si);
    if (threadIdx.x == 0) {
      ws_val[out + j] = bv;
      ws_idx[out + j] = bi;
    }
    if (bi != kSentinelIdx && id[0] == bi) {  // token ids are unique: one owner pops
#pragma unroll
      for (int q = 0; q < MAX_K - 1; ++q) {
        v[q] = v[q + 1];
        id[q] = id[q + 1];
      }
      v[MAX_K - 1] = -INFINITY;
      id[MAX_K - 1] = kSentinelIdx;
    }
  }
}

// ---- stage 2: per batch entry -------------------------------------------------------------------
// Block of 32 * beam threads (beam warps; 2 * beam^2 <= 32 * beam candidates, one per thread).
__global__ void __launch_bounds__(32 * kMaxBeamWidth)
    beam_stage2_kernel(const BeamStepParams p, int K, int splits, const float* __restrict__ ws_val,
                       const int* __restrict__ ws_idx) {
  const BeamSearchState& s = p.s;
  const int b = blockIdx.x;
  const int W = s.beam;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  __shared__ float row_v[kMaxBeamWidth * kMaxK];
  __shared__ int row_i[kMaxBeamWidth * kMaxK];
  __shared__ float top_v[kMaxK];           // entry's candidates by rank: score
  __shared__ int top_flat[kMaxK];          // k * vocab + token
  __shared__ float top_pen[kMaxK];         // score with the end-token penalty
  __shared__ int run_src[kMaxBeamWidth];   // running beam j <- candidate rank
  __shared__ int slot_src[kMaxBeamWidth];  // hypothesis slot <- candidate rank (-1: unchanged)
  __shared__ int entry_done;

  if (tid == 0) entry_done = s.done[b];
  __syncthreads();
  if (entry_done) {
    if (tid < W) {
      const int r = b * W + tid;
      s.parents[r] = tid;
      s.tokens[r] = s.end_ids[b];
      s.token_log_probs[r] = 0.f;
    }
    return;
  }

  // (a) Row k = warp: merge the sorted split lists (lane l walks list l).
  if (warp < W) {
    const int row = b * W + warp;
    const int64_t base = static_cast<int64_t>(row) * splits * K;
    int ptr = 0;
    for (int j = 0; j < K; ++j) {
      float hv = -INFINITY;
      int hi = kSentinelIdx;
      if (lane < splits && ptr < K) {
        hv = ws_val[base + static_cast<int64_t>(lane) * K + ptr];
        hi = ws_idx[base + static_cast<int64_t>(lane) * K + ptr];
      }
      float bv = hv;
      int bi = hi;
      warp_best(bv, bi);
      if (bi != kSentinelIdx && hi == bi) ++ptr;
      if (lane == 0) {
        row_v[warp * K + j] = bv;
        row_i[warp * K + j] = bi;
      }
    }
  }
  __syncthreads();

  // (b) Diversity penalty by rank within the row, then the entry's top K by counting ranks.
  const int n = W * K;
  float my_v = -INFINITY;
  int my_flat = INT_MAX;
  if (tid < n) {
    const int k = tid / K, j = tid % K;
    const int tok = row_i[tid];
    if (tok == kSentinelIdx) {
      my_flat = W * p.vocab + tid;  // unique, after every real candidate
    } else {
      my_v = __fsub_rn(row_v[tid], __fmul_rn(p.diversity_rate, static_cast<float>(j)));
      my_flat = k * p.vocab + tok;
    }
  }
  __syncthreads();  // row_v / row_i are reused below
  if (tid < n) {
    row_v[tid] = my_v;
    row_i[tid] = my_flat;
  }
  __syncthreads();
  if (tid < n) {
    int rank = 0;
    for (int u = 0; u < n; ++u) rank += better(row_v[u], row_i[u], my_v, my_flat) ? 1 : 0;
    if (rank < K) {
      top_v[rank] = my_v;
      top_flat[rank] = my_flat;
    }
  }
  __syncthreads();

  // (c) Running beams: top W of the candidates with end tokens pushed down by 1e9.
  const int32_t end_id = s.end_ids[b];
  if (tid < K) {
    const bool hit = (top_flat[tid] % p.vocab) == end_id;
    top_pen[tid] = hit ? __fadd_rn(top_v[tid], kBeamImpossible) : top_v[tid];
  }
  __syncthreads();
  if (tid < K) {
    int rank = 0;
    for (int u = 0; u < K; ++u) rank += better(top_pen[u], u, top_pen[tid], tid) ? 1 : 0;
    if (rank < W) run_src[rank] = tid;
  }
  if (tid < W) slot_src[tid] = -1;
  __syncthreads();

  // (d) Finished hypotheses and the early-stop heuristic (sequential, at most W insertions).
  const int len = s.input_lengths[b];
  const int g = s.gen_len[b];
  const int pos = len + g;  // position of the new token
  if (tid == 0) {
    const float denom = length_denominator(g + 1, p.length_penalty);
    float* hs = s.hyp_score + static_cast<int64_t>(b) * W;
    int count = s.hyp_count[b];
    for (int c = 0; c < W; ++c) {
      if ((top_flat[c] % p.vocab) != end_id) continue;
      const float score = __fdiv_rn(top_v[c], denom);
      int slot = -1;
      if (count < W) {
        slot = count++;
      } else {
        int worst = 0;
        for (int j = 1; j < W; ++j) {
          if (hs[j] <= hs[worst]) worst = j;
        }
        if (score > hs[worst]) slot = worst;
      }
      if (slot < 0) continue;
      hs[slot] = score;
      s.hyp_cum[static_cast<int64_t>(b) * W + slot] = top_v[c];
      s.hyp_len[static_cast<int64_t>(b) * W + slot] = pos + 1;
      slot_src[slot] = c;
    }
    s.hyp_count[b] = count;
    if (count == W) {
      float lowest = hs[0];
      for (int j = 1; j < W; ++j) lowest = fminf(lowest, hs[j]);
      const float best_running = __fdiv_rn(top_pen[run_src[0]], denom);
      if (!(best_running > lowest)) s.done[b] = 1;
    }
  }
  // (e) The new running beams.
  if (tid < W) {
    const int c = run_src[tid];
    const int parent = top_flat[c] / p.vocab, tok = top_flat[c] % p.vocab;
    const int r = b * W + tid;
    s.parents[r] = parent;
    s.tokens[r] = tok;
    s.cum_log_probs[r] = top_pen[c];
    s.token_log_probs[r] = log_prob_row(p, b, parent)[tok];
  }
  __syncthreads();

  // (f) Sequences of the new hypotheses: the parent's running row plus the new token.
  for (int slot = 0; slot < W; ++slot) {
    const int c = slot_src[slot];
    if (c < 0) continue;
    const int parent = top_flat[c] / p.vocab, tok = top_flat[c] % p.vocab;
    const int prow = b * W + parent;
    const int64_t h = static_cast<int64_t>(b) * W + slot;
    const int32_t* src = s.output_ids + static_cast<int64_t>(prow) * s.ids_stride;
    int32_t* dst = s.hyp_ids + h * s.ids_stride;
    const int upto = min(pos, s.ids_stride);
    for (int q = tid; q < upto; q += blockDim.x) dst[q] = src[q];
    if (tid == 0 && pos < s.ids_stride) dst[pos] = tok;
    if (s.hyp_log_probs != nullptr && s.run_log_probs != nullptr) {
      const float* lsrc = s.run_log_probs + static_cast<int64_t>(prow) * s.max_out;
      float* ldst = s.hyp_log_probs + h * s.max_out;
      const int lupto = min(g, s.max_out);
      for (int q = tid; q < lupto; q += blockDim.x) ldst[q] = lsrc[q];
      if (tid == 0 && g < s.max_out) ldst[g] = log_prob_row(p, b, parent)[tok];
    }
  }
}

// ---- update: in-place reorder -------------------------------------------------------------------
// rows[k][c] = rows[par[k]][c] for c in [lo, hi), k < W with par[k] != k. Each pass reads a chunk
// of columns of every row into registers, synchronises, then writes it.
template <typename T>
__device__ void gather_rows_inplace(T* base, int64_t stride, int W, const int* par, int lo,
                                    int hi) {
  constexpr int kItems = 4;
  if (hi <= lo) return;
  const int cols = max(1, (kItems * static_cast<int>(blockDim.x)) / W);
  for (int c0 = lo; c0 < hi; c0 += cols) {
    T vals[kItems];
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const int e = threadIdx.x + it * blockDim.x;
      const int k = e / cols, c = c0 + e % cols;
      if (k < W && c < hi && par[k] != k) vals[it] = base[par[k] * stride + c];
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const int e = threadIdx.x + it * blockDim.x;
      const int k = e / cols, c = c0 + e % cols;
      if (k < W && c < hi && par[k] != k) base[k * stride + c] = vals[it];
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kRowThreads) beam_update_kernel(const BeamSearchState s) {
  const int b = blockIdx.x;
  const int W = s.beam;
  __shared__ int par[kMaxBeamWidth];
  __shared__ int moved;
  if (threadIdx.x == 0) moved = 0;
  __syncthreads();
  if (threadIdx.x < W) {
    int q = s.parents[b * W + threadIdx.x];
    if (q < 0 || q >= W) q = threadIdx.x;  // never read outside the entry's rows
    par[threadIdx.x] = q;
    if (q != static_cast<int>(threadIdx.x)) atomicOr(&moved, 1);
  }
  __syncthreads();
  const int len = s.input_lengths[b];
  const int g = s.gen_len[b];
  const int pos = len + g;
  const int64_t first = static_cast<int64_t>(b) * W;
  if (moved) {
    gather_rows_inplace(s.output_ids + first * s.ids_stride, s.ids_stride, W, par, len,
                        min(pos, s.ids_stride));
    gather_rows_inplace(s.cache_indir + first * s.indir_stride, s.indir_stride, W, par, len,
                        min(pos, s.indir_stride));
    if (s.run_log_probs != nullptr) {
      gather_rows_inplace(s.run_log_probs + first * s.max_out, static_cast<int64_t>(s.max_out), W,
                          par, 0, min(g, s.max_out));
    }
  }
  if (threadIdx.x < W) {
    const int r = b * W + threadIdx.x;
    if (pos < s.ids_stride)
      s.output_ids[static_cast<int64_t>(r) * s.ids_stride + pos] = s.tokens[r];
    if (pos < s.indir_stride) s.cache_indir[static_cast<int64_t>(r) * s.indir_stride + pos] = r;
    if (s.run_log_probs != nullptr && g < s.max_out) {
      s.run_log_probs[static_cast<int64_t>(r) * s.max_out + g] = s.token_log_probs[r];
    }
    s.cur_pos[r] = pos;
    s.attn_len[r] = pos + 1;
  }
  if (threadIdx.x == 0) s.gen_len[b] = g + 1;
}

// ---- finalize -----------------------------------------------------------------------------------
__global__ void __launch_bounds__(kRowThreads) beam_finalize_kernel(const BeamFinalizeParams p) {
  const BeamSearchState& s = p.s;
  const int b = blockIdx.x;
  const int W = s.beam;
  // Final entry i: source src >= 0 is hypothesis slot src, src < 0 running beam -(src + 1).
  __shared__ float f_score[kMaxBeamWidth], f_cum[kMaxBeamWidth];
  __shared__ int f_len[kMaxBeamWidth], f_src[kMaxBeamWidth], f_count;
  const int len = s.input_lengths[b];
  const int g = s.gen_len[b];
  if (threadIdx.x == 0) {
    float sc[kMaxBeamWidth], cm[kMaxBeamWidth];
    int ln[kMaxBeamWidth], src[kMaxBeamWidth];
    int count = s.hyp_count[b];
    for (int j = 0; j < count; ++j) {
      const int64_t h = static_cast<int64_t>(b) * W + j;
      sc[j] = s.hyp_score[h];
      cm[j] = s.hyp_cum[h];
      ln[j] = s.hyp_len[h];
      src[j] = j;
    }
    if (!s.done[b]) {
      const float denom = g > 0 ? length_denominator(g, p.length_penalty) : 1.f;
      for (int k = 0; k < W; ++k) {
        const float cum = s.cum_log_probs[b * W + k];
        const float score = __fdiv_rn(cum, denom);
        int slot = -1;
        if (count < W) {
          slot = count++;
        } else {
          int worst = 0;
          for (int j = 1; j < W; ++j) {
            if (sc[j] <= sc[worst]) worst = j;
          }
          if (score > sc[worst]) slot = worst;
        }
        if (slot < 0) continue;
        sc[slot] = score;
        cm[slot] = cum;
        ln[slot] = len + g;
        src[slot] = -(k + 1);
      }
    }
    // Best first; ties keep the lower slot first.
    bool used[kMaxBeamWidth];
    for (int j = 0; j < count; ++j) used[j] = false;
    for (int i = 0; i < count; ++i) {
      int best = -1;
      for (int j = 0; j < count; ++j) {
        if (!used[j] && (best < 0 || sc[j] > sc[best])) best = j;
      }
      used[best] = true;
      f_score[i] = sc[best];
      f_cum[i] = cm[best];
      f_len[i] = ln[best];
      f_src[i] = src[best];
    }
    f_count = count;
  }
  __syncthreads();
  const int count = f_count;
  for (int i = 0; i < W; ++i) {
    const int64_t o = static_cast<int64_t>(b) * W + i;
    int32_t* dst = p.output_ids + o * p.out_stride;
    const int32_t end_id = s.end_ids[b];
    if (i >= count) {  // only when nothing was generated and the entry is done: never in practice
      for (int q = threadIdx.x; q < p.out_stride; q += blockDim.x) dst[q] = end_id;
      if (p.output_log_probs != nullptr) {
        for (int q = threadIdx.x; q < s.max_out; q += blockDim.x) {
          p.output_log_probs[o * s.max_out + q] = 0.f;
        }
      }
      if (threadIdx.x == 0) {
        p.sequence_lengths[o] = 0;
        if (p.cum_log_probs != nullptr) p.cum_log_probs[o] = -INFINITY;
        if (p.scores != nullptr) p.scores[o] = -INFINITY;
      }
      continue;
    }
    const int src = f_src[i];
    const int total = f_len[i];
    const int32_t* ids;
    const float* lps = nullptr;
    if (src >= 0) {
      const int64_t h = static_cast<int64_t>(b) * W + src;
      ids = s.hyp_ids + h * s.ids_stride;
      if (s.hyp_log_probs != nullptr) lps = s.hyp_log_probs + h * s.max_out;
    } else {
      const int64_t r = static_cast<int64_t>(b) * W + (-src - 1);
      ids = s.output_ids + r * s.ids_stride;
      if (s.run_log_probs != nullptr) lps = s.run_log_probs + r * s.max_out;
    }
    const int copy = min(total, s.ids_stride);
    for (int q = threadIdx.x; q < p.out_stride; q += blockDim.x)
      dst[q] = q < copy ? ids[q] : end_id;
    if (p.output_log_probs != nullptr) {
      const int generated = total - len;
      float* ldst = p.output_log_probs + o * s.max_out;
      for (int q = threadIdx.x; q < s.max_out; q += blockDim.x) {
        ldst[q] = (lps != nullptr && q < generated) ? lps[q] : 0.f;
      }
    }
    if (threadIdx.x == 0) {
      p.sequence_lengths[o] = total;
      if (p.cum_log_probs != nullptr) p.cum_log_probs[o] = f_cum[i];
      if (p.scores != nullptr) p.scores[o] = f_score[i];
    }
  }
}

// ---- log-softmax --------------------------------------------------------------------------------
constexpr int kSoftmaxThreads = 512;

// May run in place (out == logits, T = float, equal strides): every element is read by the thread
// that writes it, and the last read of a row precedes its first write (hence no __restrict__).
template <typename T>
__global__ void __launch_bounds__(kSoftmaxThreads)
    log_softmax_kernel(float* out, int64_t out_stride, const T* logits, int64_t in_stride,
                       int vocab) {
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * in_stride;
  float* y = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  __shared__ float scratch[32];
  float m = -INFINITY;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float f = to_float(x[v]);
    if (f > m) m = f;  // NaN is skipped
  }
  m = warp_max(m);
  {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    m = warp_max(lane < nwarps ? scratch[lane] : -INFINITY);
  }
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
      const float f = to_float(x[v]);
      if (f == f) sum += expf(f - m);
    }
  }
  sum = block_sum(sum, scratch);
  const float lse = logf(sum);
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float f = to_float(x[v]);
    y[v] = (m == -INFINITY || f != f) ? -INFINITY : __fsub_rn(__fsub_rn(f, m), lse);
  }
}

bool state_ok(const BeamSearchState& s) {
  // Each launcher touches only its own fields; the kernels test the optional pointers.
  return s.batch >= 0 && s.beam >= 1 && s.beam <= kMaxBeamWidth && s.ids_stride > 0 &&
         s.indir_stride > 0 && s.max_out >= 0 && (s.run_log_probs == nullptr || s.max_out > 0);
}

}  // namespace

int beam_search_num_splits(int rows, int vocab) {
  if (rows <= 0 || vocab <= 0) return 1;
  const int by_vocab = ceil_div(vocab, kMinSplitVocab);
  const int by_rows = ceil_div(kTargetBlocks, rows);
  return max(1, min(kMaxSplits, min(by_vocab, by_rows)));
}

size_t beam_search_workspace_bytes(int batch, int beam, int vocab) {
  const int rows = batch * beam;
  const size_t entries = static_cast<size_t>(rows) * beam_search_num_splits(rows, vocab) * 2 * beam;
  return entries * (sizeof(float) + sizeof(int));
}

cudaError_t launch_beam_init(const BeamSearchState& s, const int32_t* input_ids,
                             int64_t input_stride, bool shared_prompt_slot, cudaStream_t stream) {
  if (!state_ok(s) || input_ids == nullptr || input_stride <= 0) return cudaErrorInvalidValue;
  if (s.batch == 0) return cudaSuccess;
  beam_init_kernel<<<s.batch * s.beam, kRowThreads, 0, stream>>>(s, input_ids, input_stride,
                                                                 shared_prompt_slot);
  return cudaGetLastError();
}

cudaError_t launch_beam_step(const BeamStepParams& p, cudaStream_t stream) {
  const BeamSearchState& s = p.s;
  if (!state_ok(s) || p.vocab < 2 || p.log_probs == nullptr || p.log_probs_stride < p.vocab) {
    return cudaErrorInvalidValue;
  }
  if (static_cast<int64_t>(s.beam) * p.vocab + 2LL * s.beam * s.beam >= INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (s.batch == 0) return cudaSuccess;
  const int rows = s.batch * s.beam;
  const int K = 2 * s.beam;
  const int splits = beam_search_num_splits(rows, p.vocab);
  const size_t need = beam_search_workspace_bytes(s.batch, s.beam, p.vocab);
  if (p.workspace == nullptr || p.workspace_bytes < need) return cudaErrorInvalidValue;
  const size_t entries = static_cast<size_t>(rows) * splits * K;
  float* ws_val = static_cast<float*>(p.workspace);
  int* ws_idx = reinterpret_cast<int*>(ws_val + entries);
  const dim3 grid1(rows, splits);
  if (K <= 4) {
    beam_stage1_kernel<4><<<grid1, kStage1Threads, 0, stream>>>(p, K, splits, ws_val, ws_idx);
  } else if (K <= 8) {
    beam_stage1_kernel<8><<<grid1, kStage1Threads, 0, stream>>>(p, K, splits, ws_val, ws_idx);
  } else if (K <= 16) {
    beam_stage1_kernel<16><<<grid1, kStage1Threads, 0, stream>>>(p, K, splits, ws_val, ws_idx);
  } else {
    beam_stage1_kernel<32><<<grid1, kStage1Threads, 0, stream>>>(p, K, splits, ws_val, ws_idx);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  beam_stage2_kernel<<<s.batch, 32 * s.beam, 0, stream>>>(p, K, splits, ws_val, ws_idx);
  return cudaGetLastError();
}

cudaError_t launch_beam_update(const BeamSearchState& s, cudaStream_t stream) {
  if (!state_ok(s)) return cudaErrorInvalidValue;
  if (s.batch == 0) return cudaSuccess;
  beam_update_kernel<<<s.batch, kRowThreads, 0, stream>>>(s);
  return cudaGetLastError();
}

cudaError_t launch_beam_finalize(const BeamFinalizeParams& p, cudaStream_t stream) {
  if (!state_ok(p.s) || p.output_ids == nullptr || p.sequence_lengths == nullptr ||
      p.out_stride <= 0) {
    return cudaErrorInvalidValue;
  }
  if (p.output_log_probs != nullptr && p.s.max_out <= 0) return cudaErrorInvalidValue;
  if (p.s.batch == 0) return cudaSuccess;
  beam_finalize_kernel<<<p.s.batch, kRowThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_log_softmax(float* out, int64_t out_stride, const T* logits, int64_t in_stride,
                               int rows, int vocab, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || out_stride < vocab || in_stride < vocab) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  log_softmax_kernel<T>
      <<<rows, kSoftmaxThreads, 0, stream>>>(out, out_stride, logits, in_stride, vocab);
  return cudaGetLastError();
}

template cudaError_t launch_log_softmax<float>(float*, int64_t, const float*, int64_t, int, int,
                                               cudaStream_t);
template cudaError_t launch_log_softmax<__half>(float*, int64_t, const __half*, int64_t, int, int,
                                                cudaStream_t);
template cudaError_t launch_log_softmax<__nv_bfloat16>(float*, int64_t, const __nv_bfloat16*,
                                                       int64_t, int, int, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

// Generation-state update after sampling (see token_update.h). One warp per row: lane 0 owns the
// row's state, the 32 lanes check the stop-word entries in parallel.
#include "kernels/common.cuh"
#include "kernels/sampling/token_update.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

// True when some lane finds a stop word of this row that ends with token t at position pos.
// Positions before pos are read from output_ids (already written by earlier steps, or prompt).
__device__ bool ends_with_stop_word(const TokenUpdateParams& p, int r, int pos, int t) {
  const int lane = threadIdx.x & 31;
  const int L = p.stop_words_len;
  const int32_t* __restrict__ words = p.stop_words + r * p.stop_words_row_stride;  // [L]
  const int32_t* __restrict__ offsets = words + L;                                 // [L]
  const int32_t* __restrict__ seq = p.output_ids + static_cast<int64_t>(r) * p.output_stride;
  bool hit = false;
  for (int i = lane; i < L && !hit; i += 32) {
    const int end = offsets[i];
    const int start = i == 0 ? 0 : offsets[i - 1];
    if (end <= 0 || end > L || start < 0 || start >= end) continue;
    if (words[end - 1] != t) continue;
    const int n = end - start;
    const int first = pos - (n - 1);  // position matched by words[start]
    if (first < 0) continue;
    bool match = true;
    for (int j = 0; j < n - 1 && match; ++j) match = seq[first + j] == words[start + j];
    hit = match;
  }
  return __any_sync(0xffffffffu, hit);
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    update_tokens_kernel(const TokenUpdateParams p) {
  const int r = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= p.rows) return;  // whole warps leave together
  if (p.finished[r]) {
    if (lane == 0) p.next_tokens[r] = p.end_ids[r];
    return;
  }
  const int pos = p.cur_pos[r] + 1;
  if (pos < 0 || pos >= p.output_stride) {
    if (lane == 0) {
      p.finished[r] = 1;
      p.next_tokens[r] = p.end_ids[r];
    }
    return;
  }
  const int t = p.tokens[r];
  const bool stop = p.stop_words != nullptr && ends_with_stop_word(p, r, pos, t);
  if (lane != 0) return;
  p.output_ids[static_cast<int64_t>(r) * p.output_stride + pos] = t;
  p.cur_pos[r] = pos;
  p.attn_len[r] = pos + 1;
  p.seq_lengths[r] = pos + 1;
  p.next_tokens[r] = t;
  if (p.token_log_probs != nullptr) {
    const float lp = p.token_log_probs[r];
    if (p.cum_log_probs != nullptr) p.cum_log_probs[r] += lp;
    const int col = p.input_lengths != nullptr ? pos - p.input_lengths[r] : p.step;
    if (p.output_log_probs != nullptr && col >= 0 && col < p.log_probs_stride) {
      p.output_log_probs[static_cast<int64_t>(r) * p.log_probs_stride + col] = lp;
    }
  }
  if (p.token_counts != nullptr && t >= 0 && t < p.vocab) {
    p.token_counts[static_cast<int64_t>(r) * p.vocab + t] += 1;
  }
  if (t == p.end_ids[r] || pos + 1 >= p.output_stride || stop) p.finished[r] = 1;
}

}  // namespace

cudaError_t launch_update_tokens(const TokenUpdateParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.output_stride <= 0) return cudaErrorInvalidValue;
  if (p.stop_words != nullptr && (p.stop_words_len < 0 || p.stop_words_row_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.token_counts != nullptr && p.vocab <= 0) return cudaErrorInvalidValue;
  if (p.output_log_probs != nullptr && p.log_probs_stride <= 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  update_tokens_kernel<<<ceil_div(p.rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace warpformer

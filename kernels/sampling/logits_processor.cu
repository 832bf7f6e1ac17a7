// Logits processor and token counts (see logits_processor.h for the contract).
//
// The processor is element-wise over [rows, vocab] plus a handful of bans per row, so it runs on
// a 2-D grid: blockIdx.x is the row and blockIdx.y a chunk of kChunk columns. Each block first
// writes its columns (penalties, temperature), then, after a barrier, applies the bans that fall
// in its own columns, so a ban always overwrites the penalised value and no second launch is
// needed. The bad-words list is scanned by the threads of each block in parallel (one entry per
// thread); entries are short and the list is read from L1/L2.
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/sampling/logits_processor.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = kThreads * 8;

__device__ __forceinline__ float positive_or_one(float v) { return v > 0.f ? v : 1.f; }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    process_logits_kernel(const LogitsProcessorParams<T> p) {
  const int r = blockIdx.x;
  const int c0 = blockIdx.y * kChunk;
  const int c1 = min(c0 + kChunk, p.vocab);
  const T* __restrict__ in = p.logits + static_cast<int64_t>(r) * p.logits_stride;  // [vocab]
  float* __restrict__ out = p.out + static_cast<int64_t>(r) * p.out_stride;         // [vocab]
  const int32_t* __restrict__ counts =
      p.token_counts ? p.token_counts + static_cast<int64_t>(r) * p.vocab : nullptr;  // [vocab]

  const float rep = positive_or_one(p.repetition_penalty ? p.repetition_penalty[r] : 1.f);
  const float pres = p.presence_penalty ? p.presence_penalty[r] : 0.f;
  const float freq = p.frequency_penalty ? p.frequency_penalty[r] : 0.f;
  const float temp = positive_or_one(p.temperature ? p.temperature[r] : 1.f);
  const bool penalise = counts != nullptr && (rep != 1.f || pres != 0.f || freq != 0.f);

  for (int v = c0 + threadIdx.x; v < c1; v += kThreads) {
    float x = to_float(in[v]);
    if (penalise) {
      const int c = counts[v];
      if (c > 0) {
        if (rep != 1.f) x = x < 0.f ? x * rep : x / rep;
        x -= freq * static_cast<float>(c);
        x -= pres;
      }
    }
    if (temp != 1.f) x = x / temp;
    out[v] = x;
  }

  const bool min_len_ban = p.min_length != nullptr && p.end_ids != nullptr;
  if (!min_len_ban && p.bad_words == nullptr) return;
  __syncthreads();  // the bans below overwrite values written by other threads of this block

  if (min_len_ban && threadIdx.x == 0) {
    const int generated = (p.input_lengths != nullptr && p.cur_pos != nullptr)
                              ? p.cur_pos[r] + 1 - p.input_lengths[r]
                              : p.step;
    const int end_id = p.end_ids[r];
    if (generated < p.min_length[r] && end_id >= c0 && end_id < c1) out[end_id] = -INFINITY;
  }
  if (p.bad_words != nullptr) {
    const int L = p.bad_words_len;
    const int32_t* __restrict__ words = p.bad_words + r * p.bad_words_row_stride;  // [L]
    const int32_t* __restrict__ offsets = words + L;                               // [L]
    for (int i = threadIdx.x; i < L; i += kThreads) {
      const int end = offsets[i];
      const int start = i == 0 ? 0 : offsets[i - 1];
      if (end <= 0 || end > L || start < 0 || start >= end) continue;
      const int last = words[end - 1];
      if (last < c0 || last >= c1) continue;  // another block's columns (or outside the vocab)
      const int n = end - start;
      if (n > 1) {
        if (p.cur_pos == nullptr || p.output_ids == nullptr) continue;
        const int cp = p.cur_pos[r];
        const int first = cp - (n - 2);  // sequence position matched by words[start]
        if (first < 0 || cp >= p.output_stride) continue;
        const int32_t* __restrict__ seq =
            p.output_ids + static_cast<int64_t>(r) * p.output_stride + first;
        bool match = true;
        for (int j = 0; j < n - 1 && match; ++j) match = seq[j] == words[start + j];
        if (!match) continue;
      }
      out[last] = -INFINITY;
    }
  }
}

// One block per row: zero the row, then add the prompt's tokens.
__global__ void __launch_bounds__(256) init_counts_kernel(const TokenCountInitParams p) {
  const int r = blockIdx.x;
  int32_t* __restrict__ counts = p.counts + static_cast<int64_t>(r) * p.vocab;  // [vocab]
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x) counts[v] = 0;
  __syncthreads();  // the block's zeroing is visible to its own atomics below
  const int len = min(p.lengths[r], p.ids_stride);
  const int32_t* __restrict__ ids = p.ids + static_cast<int64_t>(r) * p.ids_stride;  // [len]
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const int t = ids[i];
    if (t >= 0 && t < p.vocab) atomicAdd(&counts[t], 1);
  }
}

__global__ void add_counts_kernel(const TokenCountAddParams p) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  if (p.finished != nullptr && p.finished[r]) return;
  const int t = p.tokens[r];
  if (t >= 0 && t < p.vocab) p.counts[static_cast<int64_t>(r) * p.vocab + t] += 1;
}

}  // namespace

template <typename T>
cudaError_t launch_process_logits(const LogitsProcessorParams<T>& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || (p.logits_stride != 0 && p.logits_stride < p.vocab) ||
      p.out_stride < p.vocab) {
    return cudaErrorInvalidValue;
  }
  if (p.bad_words != nullptr && (p.bad_words_len < 0 || p.bad_words_row_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  const int chunks = ceil_div(p.vocab, kChunk);
  if (chunks > 65535) return cudaErrorInvalidValue;
  process_logits_kernel<T><<<dim3(p.rows, chunks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_init_token_counts(const TokenCountInitParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || p.ids_stride < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  init_counts_kernel<<<p.rows, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_add_token_counts(const TokenCountAddParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  add_counts_kernel<<<ceil_div(p.rows, 128), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_process_logits<float>(const LogitsProcessorParams<float>&,
                                                  cudaStream_t);
template cudaError_t launch_process_logits<__half>(const LogitsProcessorParams<__half>&,
                                                   cudaStream_t);
template cudaError_t launch_process_logits<__nv_bfloat16>(
    const LogitsProcessorParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

// Token sampler: greedy, top-k, top-p (nucleus) and plain sampling from processed fp32 logits,
// with a counter-based RNG so that a row's draw depends only on its seed and position.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

constexpr int kSamplerMaxTopK = 1024;

// For each row r (logits already processed: penalties, bans, temperature; banned = -inf):
//   k = top_k[r] (null: 1). k == 1: token = argmax (lowest index among equal maxima, as
//       torch.argmax). k <= 0: no top-k filter. k > kSamplerMaxTopK is clamped to it.
//   p = top_p[r] (null: 1), in (0, 1]; p >= 1: no top-p filter.
//   Otherwise, with probs = softmax(logits[r, :vocab]):
//     1. top-k keeps the k most probable tokens;
//     2. top-p keeps, within that set and renormalised to it, the smallest prefix (in the same
//        order) whose mass reaches p: a token is kept iff the mass of the kept tokens ranked
//        above it is < p (HF's TopPLogitsWarper; the most probable token is always kept);
//     3. the token is drawn by inverse CDF, in that order, with u = uniform[0, 1) from Philox
//        keyed by seeds[r] (null: 0) at counter positions[r] + position_offset, i.e. the position
//        of the token being generated (see philox.cuh).
//   Order and ties: tokens are ranked by logit, descending, and equal logits by index,
//   ascending (a stable descending sort). Top-k therefore keeps exactly min(k, #finite) tokens,
//   taking the lowest indices among those tied at the k-th value, and top-p cuts inside a group
//   of tied tokens by the same rule.
//   log_probs[r] = log_softmax(logits[r, :vocab])[token]: before top-k/top-p.
// Non-finite logits: NaN is treated as -inf, +inf as FLT_MAX; -inf tokens are never drawn. A
// row whose logits are all -inf gets token 0 and log-prob -inf.
//
// Implementation: one block per row, reading the row from global memory (it stays in L2 across
// the passes; 1 MB for BLOOM's 250,880 columns). Pass 1: max, argmax and the softmax
// denominator (online). Top-k (and top-p when the nucleus lies within the 1024 most probable
// tokens): a 4-pass radix select over the logits' order-preserving bit patterns with 256-bucket
// count histograms finds the k-th value exactly, the k tokens are gathered into shared memory,
// bitonic-sorted and scanned. Top-p with a larger nucleus, and unfiltered sampling of more than
// 1024 tokens: a 4-pass radix select with probability-mass histograms (fixed-point, so the
// result is bit-for-bit reproducible) finds the nucleus threshold, then a block-wide prefix sum
// in index order draws the token. No host synchronisation, no workspace, graph-capturable.
struct SamplerParams {
  const float* logits;       // [rows, logits_stride], processed, fp32
  int32_t* tokens;           // [rows] chosen token
  float* log_probs;          // [rows] or null
  const int32_t* top_k;      // [rows] or null (1 = greedy)
  const float* top_p;        // [rows] or null (1 = off)
  const uint64_t* seeds;     // [rows] or null (0)
  const int32_t* positions;  // [rows] or null (0); RNG counter = positions[r] + position_offset
  int64_t logits_stride;     // >= vocab, or 0: all rows read row 0
  int position_offset;       // 1 when `positions` is the generation state's cur_pos
  int rows;
  int vocab;
};

cudaError_t launch_sample_tokens(const SamplerParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer

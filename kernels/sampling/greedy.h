// Greedy decoding step on the device: argmax of each row's logits, then the generation-state
// update (output ids, lengths, end-of-sequence flags), so no host synchronisation is needed
// between steps.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// State of a batch being generated (all device arrays of `rows` entries):
//   cur_pos[r]   position of row r's newest token (the one the next step feeds)
//   attn_len[r]  cur_pos[r] + 1: cache length seen by the next step's attention
//   finished[r]  1 once row r produced its end id
// For each unfinished row: token = argmax(logits[r]) (lowest index among ties); cur_pos += 1;
// output_ids[r, cur_pos] = token; seq_lengths[r] = cur_pos + 1; finished if token == end_ids[r].
// Finished rows keep their state and feed their end id. next_tokens[r] receives the token fed to
// the next step.
template <typename T>
struct GreedyStepParams {
  const T* logits;         // [rows, vocab] (row stride logits_stride)
  int32_t* next_tokens;    // [rows]
  int32_t* cur_pos;        // [rows]
  int32_t* attn_len;       // [rows]
  int32_t* finished;       // [rows]
  int32_t* output_ids;     // [rows, output_stride]
  int32_t* seq_lengths;    // [rows]
  const int32_t* end_ids;  // [rows]
  int rows;
  int vocab;
  int64_t logits_stride;
  int output_stride;  // also the bound on positions written
  // Scratch that splits each row's argmax over greedy_step_chunks(vocab) blocks, the last block
  // of a row to finish reducing the partial results and updating the state (null: one block per
  // row, which reads a 250k-entry vocabulary at a small fraction of the memory bandwidth).
  // arrivals must be zero before the first launch; every launch leaves them zero.
  uint32_t* arrivals = nullptr;        // [rows]
  float* partial_values = nullptr;     // [rows, greedy_step_chunks(vocab)]
  int32_t* partial_indices = nullptr;  // [rows, greedy_step_chunks(vocab)]
};

// Blocks per row of a split greedy step (1 for a vocabulary of up to 4,096 entries).
int greedy_step_chunks(int vocab);

// Launched programmatically dependent (kernels/common.cuh): its blocks are scheduled while the
// lm_head product ahead of it finishes.
template <typename T>
cudaError_t launch_greedy_step(const GreedyStepParams<T>& p, cudaStream_t stream);

// flag[0] = 1 if every finished[r] != 0 else 0.
cudaError_t launch_all_finished(const int32_t* finished, int rows, int32_t* flag,
                                cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer

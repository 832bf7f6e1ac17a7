// What the generation session needs from a model: the small interface a decoder implements so
// that greedy, sampling and beam search, the step graphs and the pipeline schedule (Session)
// work for it unchanged. A model implements it over its own layers and memory plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/dispatch.h"

namespace warpformer {
namespace generation {

// The per-row device state a decode step reads (rows = batch * beam): row r feeds tokens[r] at
// position positions[r], appending to KV slot slots[r] and attending to lengths[r] positions of
// it, through cache_indir (beam search: [rows, kv capacity] slot of each position) when set.
struct StepRows {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* lengths = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* cache_indir = nullptr;
  float* workspace = nullptr;  // Decoder::step_workspace_bytes of scratch
  size_t workspace_bytes = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;

  // How errors name the model's calls (e.g. "GptModel": "GptModel.decode_step: ...").
  virtual const char* name() const = 0;
  virtual CudaContext& context() = 0;
  virtual DType dtype() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Row width of logits() (the vocabulary padded for the vocabulary-parallel head).
  virtual int64_t logits_stride() const = 0;
  // [rows, logits_stride()] logits of the last prompt_logits or step (last pipeline stage).
  virtual void* logits() = 0;

  // The tensor-parallel group (null: one rank) and the pipeline-parallel group (null: one
  // stage); this rank's stage and the number of stages.
  virtual Communicator* tensor_group() const = 0;
  virtual Communicator* pipeline_group() const = 0;
  virtual int pipeline_stage() const = 0;
  virtual int pipeline_stages() const = 0;
  bool first_stage() const { return pipeline_stage() == 0; }
  bool last_stage() const { return pipeline_stage() == pipeline_stages() - 1; }

  // Makes room for a session of `rows` rows of up to `total` positions whose prompt passes run
  // `lengths` tokens (one per batch entry) and plans them; returns the KV capacity per slot
  // (the row stride of StepRows::cache_indir). Throws naming the limit when over it.
  virtual int64_t reserve(int64_t rows, int64_t total, const std::vector<int32_t>& lengths) = 0;
  // Bytes of StepRows::workspace a step of `rows` rows needs (after reserve).
  virtual size_t step_workspace_bytes(int64_t rows) const = 0;
  // Changes whenever a buffer a captured step may bake was reallocated (or a group attached).
  virtual size_t buffer_generation() const = 0;
  // Which KV slots the calls use now (an interactive session's, or the shared ones): captured
  // steps bake the cache addresses of one view, and run again when it returns.
  virtual int64_t cache_view() const = 0;

  // The prompt pass planned by reserve: entry b's tokens ids[b, p : p + lengths[b]] with p =
  // past[b] (empty: 0; the positions its slot already holds, an interactive session's earlier
  // turns) into KV slot b * slot_stride at positions p...; the last stage keeps each entry's
  // last hidden state for prompt_logits. When hidden_out is set ([batch, seq] rows of
  // hidden_row_bytes()), the last stage also writes there each token's final hidden state (what
  // the head multiplies), token p + i of entry b into row b * seq + p + i.
  virtual void prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
                       const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
                       void* hidden_out) = 0;
  // logits() rows [0, rows): row r from the kept hidden state of entry entry_of_row[r].
  virtual void prompt_logits(const int32_t* entry_of_row, int64_t rows) = 0;
  // The final hidden states (rows of hidden_row_bytes()) that the last prompt_logits or step
  // computed its logits from, on the last stage: row r of prompt_logits, or row r0 + r of a
  // step's rows [r0, r0 + n) at row r. Valid until the next call; a captured step bakes it.
  virtual const void* final_hidden() const = 0;
  // One decode step of rows [r0, r0 + n) (every StepRows array is offset by r0 here). The first
  // stage embeds the tokens; another stage reads stage_input(), received first when `exchange`.
  // The last stage writes logits() rows [r0, r0 + n); another leaves its hidden states in
  // stage_output(), and sends them to the next stage when `exchange`.
  virtual void step(const StepRows& rows, int64_t r0, int64_t n, bool exchange) = 0;
  // Pipeline buffers for a schedule that does its own send/recv: [n, hidden] rows received into
  // stage_input() before a step, sent from stage_output() after it, hidden_row_bytes() each.
  virtual void* stage_input() = 0;
  virtual void* stage_output() = 0;
  virtual size_t hidden_row_bytes() const = 0;
  // After an error: drop what captured work the model holds (its buffers stay).
  virtual void drop_graphs() = 0;
};

}  // namespace generation
}  // namespace warpformer

// The ends of a decoder: token (and learned position) embedding into the residual stream, and the
// lm_head from final hidden states to logits, vocabulary-parallel under tensor parallelism.
#pragma once

#include <cstdint>

#include "csrc/layers/layer_context.h"

namespace warpformer {
namespace layers {

struct EmbeddingWeights {
  const void* wte = nullptr;         // [vocab, embed_dim]
  const void* wpe = nullptr;         // [max_positions, hidden] or null
  const void* project_in = nullptr;  // [embed_dim, hidden] or null (narrow word embeddings)
  NormWeights norm;                  // the embedding norm (BLOOM) or null gamma
  int64_t vocab = 0, max_positions = 0, embed_dim = 0;
};

// Rows that stand for token embeddings (FT's prompt tuning, HF's inputs_embeds): id vocab + j
// reads row j of `rows` [count, embed_dim] (the model dtype) instead of wte.
struct PromptTable {
  const void* rows = nullptr;
  int64_t count = 0;
};

// x[tokens, hidden] = wte[ids] (or the prompt table's rows; projected in when project_in) +
// wpe[positions], then the embedding norm. Ids are range-checked by the caller. With
// project_in, emb_scratch holds [tokens, embed_dim] and pos_scratch [tokens, hidden].
void embed(const LayerContext& lc, const EmbeddingWeights& w, const int32_t* ids,
           const int32_t* positions, int64_t tokens, int64_t seq_len, void* x, void* emb_scratch,
           void* pos_scratch, const PromptTable& prompt = {});

struct LmHeadWeights {
  const void* project_out = nullptr;  // [hidden, embed_dim] or null
  const void* weight = nullptr;       // [local_vocab, embed_dim] (the tied wte, padded, or not)
  const void* bias = nullptr;         // [local_vocab] or null
  int64_t embed_dim = 0;
  int64_t local_vocab = 0;  // this rank's vocabulary slice, padded (a multiple of 8)
  int64_t tp = 1;           // vocabulary-parallel ranks (lc.comm's size when > 1)
};

// Buffers of lm_head for chunks of at most `rows` rows: proj [rows, embed_dim] (project_out),
// local [rows, local_vocab] and gathered [tp, rows, local_vocab] (tp > 1).
struct LmHeadScratch {
  void* proj = nullptr;
  void* local = nullptr;
  void* gathered = nullptr;
  int64_t rows = 0;
};

// out[rows, tp * local_vocab] = logits of the final hidden rows hidden[rows, hidden]; the ranks'
// slices all-gathered in vocabulary order.
void lm_head(const LayerContext& lc, const LmHeadWeights& w, const void* hidden, int64_t rows,
             void* out, const LmHeadScratch& scratch);

}  // namespace layers
}  // namespace warpformer

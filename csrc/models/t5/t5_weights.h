// The weight table of an encoder-decoder model (T5 and BART families): every file a T5Config
// implies in FT's layouts (docs/FORMAT.md, "T5 family", "BART family"), with its full shape, split
// axis, layer, stack and role (csrc/models/weight_table.h). The one source of that contract: the
// engine finds its weights by role in it (models::weight_name), and python/warpformer/t5_weights.py
// (t5_weight_specs, model_names, layer_names: the converters, the loader, the reference) asks for
// it through the t5_weight_table op.
#pragma once

#include <vector>

#include "csrc/models/t5/t5_config.h"
#include "csrc/models/weight_table.h"

namespace warpformer {
namespace t5 {

using models::WeightEntry;

// In forward order: the embedding(s), then per stack its model-level tensors before its layers
// (T5: the relative bias table; BART: the embedding, the position table, the embedding norm),
// each layer (self-attention, cross-attention in the decoder, FFN; each weight followed by its
// bias in the BART family) and the stack's final norm (T5, mBART); the head last (BART: and
// final_logits_bias).
//
// Names are FT's without the rank suffix and ".bin" (no "model." prefix). Linear kernels are
// [in, out]; split as FT does: Q, K, V (the decoder's fused [d, 3, inner]) and the FFN input and
// gate on their output axis, the attention outputs and the FFN output on their input axis (rows);
// T5's relative bias tables [heads, buckets] on heads; embeddings, lm_head, norms and BART's
// position tables replicated. A BART bias splits with its kernel's output axis; a row-parallel
// kernel's bias is whole and per_rank (one file per rank, FT's BART loader reads it so). Split
// axes are non-negative (the Python table's). Stages are empty: the model places tensors by
// stack and layer. T5's relative bias tables are model-level (stack "", role
// <stack>_positions: every layer of the stack reads them) with layer 0, the block whose files
// hold them.
std::vector<WeightEntry> weight_table(const T5Config& c);

}  // namespace t5
}  // namespace warpformer

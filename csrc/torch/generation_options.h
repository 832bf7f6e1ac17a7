// The options dict of docs/GENERATION_API.md, checked in one place for every caller:
// GptModel.decode* and torch.ops.warpformer.generation_options (which warpformer.GPT calls for
// both of its backends). CPU only.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <string>

namespace warpformer {
namespace ops {

// `options` for `batch` rows and a vocabulary of `vocab_size` tokens, checked and normalised:
// every key (the word lists only when given) as a new CPU tensor; per-row ones [batch] (end_id,
// top_k, min_length int32; top_p, temperature, the penalties float32; seed int64; end_id defaults
// to `end_id`), word lists int32 [2, L] or [batch, 2, L], the others 0-d (beam_width and the
// return_* flags int32, length_penalty and diversity_rate float32). Errors name the option and,
// where its name differs, GPT.generate's argument: "GptModel.decode: option 'beam_width'
// (num_beams) must be in [1, 16], got 17".
c10::Dict<std::string, at::Tensor> generation_options(
    const c10::Dict<std::string, at::Tensor>& options, int64_t batch, int64_t vocab_size,
    int64_t end_id);

}  // namespace ops
}  // namespace warpformer

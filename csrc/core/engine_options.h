// EngineOptions: the run-time choices of an engine instance that users make (CUDA graphs, the
// prefill group size). python/warpformer/options.py documents them with the Python keywords
// that set them; csrc/torch parses them from the constructor's options, and nothing below it
// reads the environment.
#pragma once

#include <cstdint>

namespace warpformer {

struct EngineOptions {
  // Decode steps and one-GPU prompt passes replayed from CUDA graphs; off, every launch is eager
  // (for profilers that attribute time per kernel, or drivers without graph support).
  bool cuda_graphs = true;
  // Tokens a prefill group holds (the activation buffer is sized for one group); 0: the model's
  // default (GptModel::prefill_group_size); its range is checked where options are parsed
  // (csrc/torch/model_options.cpp). Every rank of a parallel group must agree.
  int64_t prefill_tokens = 0;
};

}  // namespace warpformer

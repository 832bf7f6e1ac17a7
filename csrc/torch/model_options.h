// ModelOptions: what a model class's constructor takes besides its config and weights, as the
// flat JSON that warpformer.options.EngineOptions.to_json() writes: the instance's limits, its
// place in the parallel grid, the GEMM tuning file and the EngineOptions (csrc/core). One parser
// for every model class, so options are named and checked alike, and pickled state holds the
// text rather than positions.
#pragma once

#include <cstdint>
#include <string>

#include "csrc/core/engine_options.h"

namespace warpformer {

struct ModelOptions {
  int64_t max_batch = 8;
  int64_t max_seq_len = 1024;
  std::string dtype;  // "fp32", "fp16", "bf16", or "" for the weights' dtype
  int64_t tensor_para_rank = 0;
  int64_t pipeline_para_size = 1;
  int64_t pipeline_para_rank = 0;
  // The `warpformer gemm-tune` file; "" takes $WARPFORMER_GEMM_CONFIG (the documented
  // fallback), else cuBLASLt's heuristics.
  std::string gemm_config;
  EngineOptions engine;

  // Parses and checks; errors name `what`, the key and the rule (unknown keys included).
  static ModelOptions from_json(const std::string& json, const char* what);
  std::string to_json() const;
  // gemm_config, else $WARPFORMER_GEMM_CONFIG, else "".
  std::string tuning_file() const;
};

}  // namespace warpformer

#include "csrc/torch/model_options.h"

#include <c10/util/Exception.h>

#include <climits>
#include <cstdlib>
#include <map>

#include "csrc/core/flat_json.h"

namespace warpformer {

ModelOptions ModelOptions::from_json(const std::string& json, const char* what) {
  const FlatJson j = FlatJson::parse(json, what);
  j.check_known({"max_batch", "max_seq_len", "dtype", "tensor_para_rank", "pipeline_para_size",
                 "pipeline_para_rank", "gemm_config", "cuda_graphs", "prefill_tokens"});
  ModelOptions o;
  o.max_batch = j.get_int("max_batch", o.max_batch);
  o.max_seq_len = j.get_int("max_seq_len", o.max_seq_len);
  o.dtype = j.get_string("dtype", o.dtype);
  o.tensor_para_rank = j.get_int("tensor_para_rank", o.tensor_para_rank);
  o.pipeline_para_size = j.get_int("pipeline_para_size", o.pipeline_para_size);
  o.pipeline_para_rank = j.get_int("pipeline_para_rank", o.pipeline_para_rank);
  o.gemm_config = j.get_string("gemm_config", o.gemm_config);
  o.engine.cuda_graphs = j.get_bool("cuda_graphs", o.engine.cuda_graphs);
  o.engine.prefill_tokens = j.get_int("prefill_tokens", o.engine.prefill_tokens);
  TORCH_CHECK(o.max_batch > 0, what, ": max_batch must be positive, got ", o.max_batch);
  TORCH_CHECK(o.max_seq_len > 0, what, ": max_seq_len must be positive, got ", o.max_seq_len);
  TORCH_CHECK(o.engine.prefill_tokens >= 0 && o.engine.prefill_tokens <= INT32_MAX, what,
              ": prefill_tokens must be a positive number of tokens (at most 2^31 - 1), or 0 for "
              "the default, got ",
              o.engine.prefill_tokens);
  return o;
}

std::string ModelOptions::to_json() const {
  auto number = [](int64_t v) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::kNumber;
    s.number = static_cast<double>(v);
    return s;
  };
  auto text = [](const std::string& v) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::kString;
    s.text = v;
    return s;
  };
  JsonScalar graphs;
  graphs.kind = JsonScalar::Kind::kBool;
  graphs.boolean = engine.cuda_graphs;
  const std::map<std::string, JsonScalar> values = {
      {"max_batch", number(max_batch)},
      {"max_seq_len", number(max_seq_len)},
      {"dtype", text(dtype)},
      {"tensor_para_rank", number(tensor_para_rank)},
      {"pipeline_para_size", number(pipeline_para_size)},
      {"pipeline_para_rank", number(pipeline_para_rank)},
      {"gemm_config", text(gemm_config)},
      {"cuda_graphs", graphs},
      {"prefill_tokens", number(engine.prefill_tokens)},
  };
  return FlatJson::write(values);
}

std::string ModelOptions::tuning_file() const {
  if (!gemm_config.empty()) return gemm_config;
  const char* env = std::getenv("WARPFORMER_GEMM_CONFIG");
  return env != nullptr ? env : "";
}

}  // namespace warpformer

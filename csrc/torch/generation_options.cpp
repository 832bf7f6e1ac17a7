// generation_options.h: each option's dtype, shape and range rule, stated once.
#include "csrc/torch/generation_options.h"

#include <ATen/ATen.h>

#include <cmath>

#include "kernels/sampling/beam_search.h"
#include "kernels/sampling/sampler.h"

namespace warpformer {
namespace {

using Options = c10::Dict<std::string, at::Tensor>;

// Every key, for the unknown-key message and its check (", key, " within ", " + kKnown + ", ").
constexpr const char* kKnown =
    "end_id, top_k, top_p, temperature, repetition_penalty, presence_penalty, frequency_penalty, "
    "min_length, seed, bad_words, stop_words, beam_width, length_penalty, diversity_rate, "
    "return_log_probs, return_cum_log_probs, return_context_embeddings, return_hidden_states, "
    "memory_len, session, prompt_table";

// How messages name an option: its key, and GPT.generate's argument where the name differs.
std::string option(const std::string& key) {
  return "GptModel.decode: option '" + key + (key == "beam_width" ? "' (num_beams)" : "'");
}

// Integer options take integer tensors, the others any real tensor; bool only for flags.
enum class Kind { kInteger, kReal, kFlag };

void check_dtype(const at::Tensor& t, const std::string& key, Kind kind) {
  const bool ok = !t.is_complex() &&
                  (kind == Kind::kReal ? t.scalar_type() != at::kBool : !t.is_floating_point()) &&
                  (kind != Kind::kInteger || t.scalar_type() != at::kBool);
  TORCH_CHECK(ok, option(key), " must be ", kind == Kind::kReal ? "a real" : "an integer",
              " tensor, got ", t.scalar_type());
}

// Every value of a contiguous CPU tensor of T passes `ok`.
template <typename T, typename Ok>
void check_rows(const at::Tensor& t, const std::string& key, Ok ok, const std::string& rule) {
  const T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK(ok(p[i]), option(key), " must be ", rule, ", got ", p[i], " (row ", i, ")");
  }
}

// t as a new contiguous CPU tensor of dtype `dt`; int64 values that int32 cannot hold refused.
at::Tensor converted(const at::Tensor& t, const std::string& key, at::ScalarType dt) {
  const at::Tensor c = t.to(at::kCPU).contiguous();
  if (dt == at::kInt && c.scalar_type() == at::kLong) {
    check_rows<int64_t>(
        c.reshape({-1}), key, [](int64_t v) { return v == static_cast<int32_t>(v); },
        "a 32-bit integer");
  }
  return c.to(dt, /*non_blocking=*/false, /*copy=*/true);
}

// A per-row option as a CPU tensor [batch] of `dt` (a 0-d or one-value tensor broadcast).
at::Tensor per_row(const Options& o, const std::string& key, at::ScalarType dt, double def,
                   int64_t batch) {
  if (!o.contains(key)) return at::full({batch}, def, at::dtype(dt));
  const at::Tensor t = o.at(key);
  check_dtype(t, key, at::isFloatingType(dt) ? Kind::kReal : Kind::kInteger);
  TORCH_CHECK(t.dim() == 0 || (t.dim() == 1 && (t.size(0) == batch || t.size(0) == 1)), option(key),
              " must be a scalar or have one value per row (", batch, "), got shape ", t.sizes());
  return converted(t, key, dt).reshape({-1}).expand({batch}).contiguous();
}

// A single-value option (one element, any shape) as a double.
double scalar(const Options& o, const std::string& key, double def, Kind kind) {
  if (!o.contains(key)) return def;
  const at::Tensor t = o.at(key);
  check_dtype(t, key, kind);
  TORCH_CHECK(t.numel() == 1, option(key), " must be a single value, got shape ", t.sizes());
  return t.item<double>();
}

// A finite float of a real option.
float finite(const Options& o, const std::string& key, double def) {
  const double v = scalar(o, key, def, Kind::kReal);
  TORCH_CHECK(std::isfinite(static_cast<float>(v)), option(key), " must be finite, got ", v);
  return static_cast<float>(v);
}

// FT word lists: [2, L] (shared) or [batch, 2, L]; row 0 token ids, row 1 end offsets (-1 pad).
at::Tensor word_list(const at::Tensor& t, const std::string& key, int64_t batch, int64_t vocab) {
  check_dtype(t, key, Kind::kInteger);
  TORCH_CHECK(
      (t.dim() == 2 && t.size(0) == 2) || (t.dim() == 3 && t.size(0) == batch && t.size(1) == 2),
      option(key), " must have shape [2, L] or [", batch,
      ", 2, L] (FT format: token ids, then end offsets), got ", t.sizes());
  const int64_t L = t.size(-1);
  TORCH_CHECK(L >= 1, option(key), " is empty");
  const at::Tensor w = converted(t, key, at::kInt);
  const int32_t* p = w.data_ptr<int32_t>();
  for (int64_t b = 0; b < (w.dim() == 3 ? batch : 1); ++b) {
    const int32_t* ids = p + b * 2 * L;
    const int32_t* offs = ids + L;
    int32_t prev = 0;
    for (int64_t i = 0; i < L && offs[i] >= 0; ++i) {
      TORCH_CHECK(offs[i] > prev && offs[i] <= L, option(key),
                  " offsets must increase and stay <= L (", L, "), got ", offs[i], " at ", i);
      prev = offs[i];
    }
    for (int64_t i = 0; i < prev; ++i) {
      TORCH_CHECK(ids[i] >= 0 && ids[i] < vocab, option(key), " token ", ids[i],
                  " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  return w;
}

}  // namespace

namespace ops {

Options generation_options(const Options& o, int64_t batch, int64_t vocab, int64_t end_id) {
  TORCH_CHECK(batch >= 1 && vocab >= 1, "GptModel.decode: batch and vocab_size must be >= 1, got ",
              batch, " and ", vocab);
  for (const auto& kv : o) {
    TORCH_CHECK(
        (", " + std::string(kKnown) + ", ").find(", " + kv.key() + ", ") != std::string::npos,
        "GptModel.decode: unknown option '", kv.key(), "'; known options: ", kKnown);
  }
  Options g;
  const auto row = [&](const char* key, at::ScalarType dt, double def) {
    const at::Tensor t = per_row(o, key, dt, def, batch);
    g.insert(key, t);
    return t;
  };
  const auto positive = [](float v) { return v > 0.f && std::isfinite(v); };
  const auto is_finite = [](float v) { return std::isfinite(v); };
  check_rows<int32_t>(
      row("end_id", at::kInt, static_cast<double>(end_id)), "end_id",
      [vocab](int32_t e) { return e >= 0 && e < vocab; }, c10::str("in [0, ", vocab, ")"));
  const at::Tensor top_k = row("top_k", at::kInt, 1);
  check_rows<int32_t>(
      top_k, "top_k", [](int32_t k) { return k >= 0 && k <= kernels::kSamplerMaxTopK; },
      c10::str("in [0, ", kernels::kSamplerMaxTopK, "]"));
  check_rows<float>(
      row("top_p", at::kFloat, 1.0), "top_p", [](float p) { return p > 0.f && p <= 1.f; },
      "in (0, 1]");
  check_rows<float>(row("temperature", at::kFloat, 1.0), "temperature", positive, "finite and > 0");
  check_rows<float>(row("repetition_penalty", at::kFloat, 1.0), "repetition_penalty", positive,
                    "finite and > 0");
  // NaN penalties pass every comparison the sampler makes and turn all logits into NaN.
  check_rows<float>(row("presence_penalty", at::kFloat, 0.0), "presence_penalty", is_finite,
                    "finite");
  check_rows<float>(row("frequency_penalty", at::kFloat, 0.0), "frequency_penalty", is_finite,
                    "finite");
  check_rows<int32_t>(
      row("min_length", at::kInt, 0), "min_length", [](int32_t m) { return m >= 0; }, ">= 0");
  check_rows<int64_t>(row("seed", at::kLong, 0), "seed", [](int64_t s) { return s >= 0; }, ">= 0");
  for (const char* key : {"bad_words", "stop_words"}) {
    if (o.contains(key)) g.insert(key, word_list(o.at(key), key, batch, vocab));
  }
  const double beam = scalar(o, "beam_width", 1, Kind::kInteger);
  TORCH_CHECK(beam >= 1 && beam <= kernels::kMaxBeamWidth, option("beam_width"), " must be in [1, ",
              kernels::kMaxBeamWidth, "], got ", beam);
  TORCH_CHECK(beam == 1 || 2 * beam <= vocab, option("beam_width"), " must be <= vocab_size / 2 (",
              vocab / 2, ": beam search ranks 2 x beam_width candidates), got ", beam);
  if (beam > 1) {
    check_rows<int32_t>(
        top_k, "top_k", [](int32_t k) { return k == 1; },
        "1 (greedy; do_sample=False) when 'beam_width' (num_beams) > 1");
    TORCH_CHECK(!g.contains("stop_words"), option("stop_words"),
                " is not supported when 'beam_width' (num_beams) > 1");
  }
  const double cum = scalar(o, "return_cum_log_probs", 0, Kind::kInteger);
  TORCH_CHECK(cum == 0 || cum == 1 || cum == 2, option("return_cum_log_probs"),
              " must be 0, 1 or 2, got ", cum);
  const auto i32 = at::dtype(at::kInt), f32 = at::dtype(at::kFloat);
  g.insert("beam_width", at::scalar_tensor(beam, i32));
  g.insert("length_penalty", at::scalar_tensor(finite(o, "length_penalty", 1.0), f32));
  g.insert("diversity_rate", at::scalar_tensor(finite(o, "diversity_rate", 0.0), f32));
  g.insert("return_log_probs",
           at::scalar_tensor(scalar(o, "return_log_probs", 0, Kind::kFlag) != 0, i32));
  g.insert("return_cum_log_probs", at::scalar_tensor(cum, i32));
  // Final hidden states (FT's context_embeddings, and those of the generated tokens' steps).
  const bool context_embeddings = scalar(o, "return_context_embeddings", 0, Kind::kFlag) != 0;
  const bool hidden_states = scalar(o, "return_hidden_states", 0, Kind::kFlag) != 0;
  TORCH_CHECK(!hidden_states || beam == 1, option("return_hidden_states"),
              " is not supported when 'beam_width' (num_beams) > 1 (beams are reordered every "
              "step)");
  g.insert("return_context_embeddings", at::scalar_tensor(context_embeddings, i32));
  g.insert("return_hidden_states", at::scalar_tensor(hidden_states, i32));
  // A bounded attention window (FT's memory_len): each token attends to its last memory_len
  // positions; 0 = none. The cache is not reused as a ring: max_seq_len still bounds a call.
  const double memory_len = scalar(o, "memory_len", 0, Kind::kInteger);
  TORCH_CHECK(memory_len >= 0 && memory_len <= INT32_MAX, option("memory_len"),
              " must be >= 0 (0: no window) and below 2^31, got ", memory_len);
  g.insert("memory_len", at::scalar_tensor(memory_len, i32));
  // An interactive session's handle (GptModel.open_session; 0: none), checked by the call.
  const double session = scalar(o, "session", 0, Kind::kInteger);
  TORCH_CHECK(session >= 0 && session <= 9007199254740992.0, option("session"),
              " must be an open_session handle (>= 1) or 0 (none), got ", session);
  g.insert("session", at::scalar_tensor(static_cast<int64_t>(session), at::dtype(at::kLong)));
  TORCH_CHECK(!context_embeddings || session == 0, option("return_context_embeddings"),
              " cannot be combined with 'session' (the prompt pass skips the positions the "
              "session's cache holds)");
  // Prompt embeddings: ids vocab + j of the call embed as row j (the model checks the width).
  if (o.contains("prompt_table")) {
    const at::Tensor& t = o.at("prompt_table");
    TORCH_CHECK(
        at::isFloatingType(t.scalar_type()) && t.dim() == 2 && t.size(0) >= 1 && t.size(1) >= 1,
        option("prompt_table"),
        " must be a floating tensor [rows, embedding width] with rows >= 1, got ", t.scalar_type(),
        " ", t.sizes());
    TORCH_CHECK(session == 0, option("prompt_table"),
                " cannot be combined with 'session' (a session row's cached prefix is matched by "
                "token ids, which the table's rows do not identify)");
    TORCH_CHECK(t.size(0) <= INT32_MAX - vocab, option("prompt_table"), " has too many rows (",
                t.size(0), ")");
    g.insert("prompt_table", t);
  }
  return g;
}

}  // namespace ops
}  // namespace warpformer

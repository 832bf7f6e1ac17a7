// The single registration file: every torch.ops.warpformer op (schema beside its one-line
// description) and every torch.classes.warpformer class, plus the Python module entry point.
//
// Ops are registered for the CUDA and the CPU dispatch keys with the same implementation: on CPU
// tensors it validates the arguments and then fails with a message that says the op needs a GPU,
// instead of the dispatcher's generic "could not run with arguments from the CPU backend".
// Fake (meta) implementations for torch.compile live in python/warpformer/_ops.py.
#include <Python.h>
#include <torch/library.h>

#include "csrc/torch/generation_options.h"
#include "csrc/torch/gpt_class.h"
#include "csrc/torch/nccl_class.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/ops_attention.h"
#include "csrc/torch/ops_beam.h"
#include "csrc/torch/ops_sampling.h"
#include "csrc/torch/seq2seq_class.h"

namespace wo = warpformer::ops;
using warpformer::GptModelHolder;
using warpformer::Seq2SeqModelHolder;

TORCH_LIBRARY(warpformer, m) {
  // LayerNorm over the last axis: weight [h], optional bias [h]; fp32 statistics.
  m.def("layer_norm(Tensor input, Tensor weight, Tensor? bias, float eps) -> Tensor");
  // RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * weight.
  m.def("rms_norm(Tensor input, Tensor weight, float eps) -> Tensor");
  // residual += input (+ input_bias) in place; returns LayerNorm(residual). Pre-/post-norm layers.
  m.def(
      "add_layer_norm(Tensor input, Tensor(a!) residual, Tensor? input_bias, Tensor weight, "
      "Tensor? bias, float eps) -> Tensor");
  // residual += input (+ input_bias) in place; returns RMSNorm(residual).
  m.def(
      "add_rms_norm(Tensor input, Tensor(a!) residual, Tensor? input_bias, Tensor weight, "
      "float eps) -> Tensor");
  // act(input + bias) for act in identity, gelu, gelu_tanh, relu, silu.
  m.def("bias_act(Tensor input, Tensor? bias, str activation) -> Tensor");
  // GLU: act(gate + b_gate) * (up + b_up), input [..., 2*I] = [gate | up] -> [..., I].
  m.def("gated_act(Tensor input, Tensor? bias, str activation) -> Tensor");
  // wte[ids] * scale (+ wpe[positions]); ids int32 [N] or [B, S]; ids vocab + j read row j of
  // `extra` (prompt embeddings, unscaled); bad ids raise, never read OOB.
  m.def(
      "embedding(Tensor input_ids, Tensor wte, Tensor? wpe=None, Tensor? position_ids=None, "
      "float scale=1.0, Tensor? extra=None) -> Tensor");
  // dst[r, index[r] + offset - base[r]] = src[r] in place for dst [rows, columns, ...], src
  // [rows, ...]; rows whose column is outside [0, columns) or whose skip[r] != 0 are left alone
  // (int32 [rows] index, base and skip; None: 0 / none). The engine's hidden-state writes.
  m.def(
      "scatter_rows_to_columns(Tensor(a!) dst, Tensor src, Tensor index, Tensor? base=None, "
      "Tensor? skip=None, int offset=0) -> ()");

  // ---- GEMM (csrc/core/gemm) ----
  // out = act(input @ weight + bias) (weight [k, n], or [n, k] when transposed). backend: auto
  // (GEMV kernel for <= 8 rows where the shape allows, else cuBLASLt), gemv, gemv_static (the
  // GEMV reading the weight before the kernel ahead of it has finished, as in the engine: the
  // caller promises that kernel does not write the weight), or cublaslt.
  // residual [m, n] is added to the result (the engine's accumulate into the residual stream).
  m.def(
      "gemm(Tensor input, Tensor weight, Tensor? bias=None, bool transposed=False, "
      "str epilogue='none', str backend='auto', Tensor? residual=None) -> Tensor");
  // (act(norm(x) @ weight + bias), x, norm(x)) for x = input (+ input_bias) (+ residual), norm
  // layer_norm or rms_norm, weight [k, n]. backend: fused (the GEMV normalises the rows itself,
  // the engine's decode path) or unfused (norms kernel, then the product); bit-identical.
  m.def(
      "norm_gemm(Tensor input, Tensor? residual, Tensor? input_bias, Tensor norm_weight, "
      "Tensor? norm_bias, str norm, float eps, Tensor weight, Tensor? bias, str activation, "
      "str backend) -> (Tensor, Tensor, Tensor)");
  // (act(norm(x) @ weight + bias), act2(norm2(x) @ weight2 + bias2), x): a parallel-residual
  // layer's QKV and MLP-in products at decode sizes (norm2: norm_weight2 / norm_bias2 when given,
  // else the first norm). backend: joined (one GEMV launch; refuses shapes it cannot run) or
  // separate (each product as norm_gemm runs it).
  m.def(
      "norm_gemm_pair(Tensor input, Tensor? residual, Tensor? input_bias, Tensor norm_weight, "
      "Tensor? norm_bias, str norm, float eps, Tensor weight, Tensor? bias, str activation, "
      "Tensor weight2, Tensor? bias2, str activation2, Tensor? norm_weight2=None, "
      "Tensor? norm_bias2=None, str backend='joined') -> (Tensor, Tensor, Tensor)");
  // input @ weight + input2 @ weight2, a parallel-residual layer's two output products at decode
  // sizes. backend: joined (one GEMV launch over both depths; refuses shapes it cannot run),
  // joined_ready (the launch the engine runs beside the attention: each k-split block streams
  // its share of input2 @ weight2 before waiting for the kernel ahead, so the caller promises
  // that kernel does not write input2 or weight2) or separate (two products, the second
  // accumulating).
  m.def(
      "gemm_sum(Tensor input, Tensor weight, Tensor input2, Tensor weight2, "
      "str backend='joined') -> Tensor");
  // act(input @ dequant(weight) + bias) for weight-only int8 / int4 weights (docs/FORMAT.md).
  // backend: auto (the quantized GEMV up to 8 rows, else dequantize + GEMM), gemv, dequant.
  m.def(
      "gemm_quant(Tensor input, Tensor weight, Tensor scale, Tensor? zero=None, Tensor? bias=None, "
      "int group_size=0, str epilogue='none', str backend='auto') -> Tensor");
  m.def(
      "dequantize_weight(Tensor weight, Tensor scale, Tensor? zero=None, int group_size=0) -> "
      "Tensor");
  // Median us of each of cuBLASLt's first max_algos candidates for this shape (gemm-tune);
  // weight may be copies stacked [copies, ...], taken in turn by the timed launches.
  m.def(
      "gemm_benchmark(Tensor input, Tensor weight, Tensor? bias, bool transposed, str epilogue, "
      "bool accumulate, int max_algos, int reps) -> Tensor");
  // "gpu=<name>;cublaslt=<version>": what a tuning file is valid for.
  m.def("gemm_fingerprint(int device=0) -> str");

  // ---- multi-GPU ----
  // A new NCCL unique id (uint8 [128], CPU), shared by warpformer.distributed with the group.
  m.def("nccl_unique_id() -> Tensor");

  // ---- models ----
  // The weight table of a GPT-family config JSON (names, full shapes, split axis, layer, stage),
  // as JSON: what warpformer.weights.weight_specs returns, so the format exists once, in C++.
  m.def("gpt_weight_table(str config) -> str");
  // The same for an encoder-decoder config (T5Config.to_json(): T5, mT5, BART, mBART), with each
  // tensor's stack and role: what warpformer.t5_weights.t5_weight_specs returns.
  m.def("t5_weight_table(str config) -> str");
  // GptModel.decode's options dict checked (errors name the option) and normalised: every key,
  // per-row ones CPU [batch], word lists int32; end_id: the default end id. CPU only.
  m.def(
      "generation_options(Dict(str, Tensor) options, int batch, int vocab_size, int end_id) -> "
      "Dict(str, Tensor)");

  // ---- attention (kernels/attention) ----
  // q = rotary(qkv[:, 0] + b); k = rotary(qkv[:, 1] + b), v = qkv[:, 2] + b written in place into
  // k_cache/v_cache [slots, heads, max_seq, head_dim] at (token_slot[t], :, token_pos[t]).
  // rotary_style: 'none' | 'interleaved' (GPT-J) | 'half' (GPT-NeoX).
  m.def(
      "qkv_rotary_cache(Tensor qkv, Tensor? bias, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor token_slot, Tensor token_pos, int rotary_dim, str rotary_style, "
      "float rotary_base) -> Tensor");
  // k = kv[:, 0] + b, v = kv[:, 1] + b written in place into k_cache/v_cache [slots, kv_heads,
  // max_seq, head_dim] at (token_slot[t], :, token_pos[t]); kv [tokens, 2, kv_heads, head_dim] or
  // [tokens, 2 kv_heads, head_dim]; no query, no rotary (a cross-attention's memory).
  m.def(
      "kv_cache_write(Tensor kv, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor token_slot, "
      "Tensor token_pos, Tensor? bias=None) -> ()");
  // Causal attention of packed sequences q [tokens, heads, head_dim] (cu_seqlens) against
  // positions 0..past+len-1 of cache slot seq_slot[b], the rows at positions past.. with past =
  // seq_past[b] (int32 [batch]; none: 0); optional ALiBi slopes [heads] (fp32). The attention
  // ops' window > 0 limits each query to its last `window` positions; their position_bias
  // [heads, 2 bias_max_distance + 1] (fp32) adds T5's relative bias of the key - query distance
  // clamped to +-bias_max_distance. causal=False: every query sees its whole sequence (window 0).
  m.def(
      "context_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens, "
      "Tensor seq_slot, Tensor? alibi_slopes, float scale, int max_seqlen, int window=0, "
      "Tensor? seq_past=None, Tensor? position_bias=None, int bias_max_distance=0, "
      "bool causal=True) -> Tensor");
  // One query per row q [rows, heads, head_dim] against lengths[r] cache positions of slot
  // row_slot[r] (or cache_indir[r, p] per position); split-KV for long caches.
  m.def(
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? row_slot, "
      "Tensor lengths, Tensor? cache_indir, Tensor? alibi_slopes, float scale, int window=0, "
      "Tensor? position_bias=None, int bias_max_distance=0) -> Tensor");
  // decode_attention with qkv_rotary_cache fused in: the query comes from qkv [rows, 3, heads,
  // head_dim] (+ bias, rotary at lengths[r] - 1); the new k/v are written into the caches there.
  // Rows need distinct slots, and no row may read another row's new position via cache_indir.
  m.def(
      "decode_attention_fused(Tensor qkv, Tensor? bias, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor? row_slot, Tensor lengths, Tensor? cache_indir, Tensor? alibi_slopes, float scale, "
      "int rotary_dim, str rotary_style, float rotary_base, int window=0, "
      "Tensor? position_bias=None, int bias_max_distance=0) -> Tensor");
  // HF BLOOM ALiBi slopes for num_heads heads (all ranks), float32 CPU tensor [num_heads].
  m.def("alibi_slopes(int num_heads) -> Tensor");

  // ---- sampling (kernels/sampling) ----
  // int32 [rows, vocab]: how often each token occurs in ids[r, :lengths[r]] (penalty state).
  m.def("count_tokens(Tensor ids, Tensor lengths, int vocab) -> Tensor");
  // counts[r, tokens[r]] += 1 in place for rows with finished[r] == 0 (all rows if None).
  m.def("add_token_counts(Tensor(a!) counts, Tensor tokens, Tensor? finished=None) -> ()");
  // float32 [rows, vocab]: repetition/frequency/presence penalties, min_length and bad-words
  // bans (-inf), then temperature. Per-row options [rows] or [] (broadcast); None = off.
  m.def(
      "process_logits(Tensor logits, Tensor? token_counts=None, "
      "Tensor? repetition_penalty=None, Tensor? presence_penalty=None, "
      "Tensor? frequency_penalty=None, Tensor? temperature=None, Tensor? min_length=None, "
      "Tensor? end_ids=None, Tensor? input_lengths=None, Tensor? cur_pos=None, "
      "Tensor? output_ids=None, Tensor? bad_words=None, int vocab=-1, int step=0) -> Tensor");
  // (tokens int32 [rows], log_probs float32 [rows]): greedy (top_k 1) or top-k/top-p sampling
  // of float32 logits; Philox keyed by seeds (int64) at counter positions (int32).
  m.def(
      "sample_tokens(Tensor logits, Tensor top_k, Tensor top_p, Tensor seeds, Tensor positions, "
      "int vocab=-1) -> (Tensor, Tensor)");
  // int32 [rows]: argmax of each row of logits [rows, V] (any float dtype; lowest index among
  // ties, NaN never chosen): the engine's greedy-step kernel, the vocabulary split over blocks
  // (split=True, the engine's way) or one block per row.
  m.def("greedy_tokens(Tensor logits, int vocab=-1, bool split=True) -> Tensor");
  // Appends tokens to the generation state in place (ends rows on end id, stop word, length);
  // returns next_tokens int32 [rows]. output_log_probs column: position - input_lengths[r] when
  // input_lengths is given, else step.
  m.def(
      "update_tokens(Tensor tokens, Tensor? log_probs, Tensor(a!) cur_pos, Tensor(b!) attn_len, "
      "Tensor(c!) finished, Tensor(d!) output_ids, Tensor(e!) seq_lengths, Tensor end_ids, "
      "Tensor? stop_words=None, Tensor(f!)? cum_log_probs=None, "
      "Tensor(g!)? output_log_probs=None, int step=0, Tensor(h!)? token_counts=None, "
      "Tensor? input_lengths=None) -> Tensor");

  // ---- beam search (kernels/sampling/beam_search) ----
  // fp32 log_softmax over the last axis of logits [rows, V] (any float dtype): beam-search input.
  m.def("beam_log_softmax(Tensor logits) -> Tensor");
  // Fresh beam-search state for input_ids int32 [B, S]: running rows [B*W, S+output_len] with the
  // prompt, cache_indir [B*W, max_seq], cum (0, -1e9, ...), empty hypothesis store.
  m.def(
      "beam_search_init(Tensor input_ids, Tensor input_lengths, Tensor end_ids, int beam_width, "
      "int output_len, int max_seq, bool shared_prompt_slot=False) -> (Tensor output_ids, "
      "Tensor cache_indir, Tensor cum_log_probs, Tensor cur_pos, Tensor attn_len, "
      "Tensor gen_len, Tensor done, Tensor hyp_count, Tensor hyp_score, Tensor hyp_cum, "
      "Tensor hyp_len, Tensor hyp_ids, Tensor run_log_probs, Tensor hyp_log_probs)");
  // One step over log_probs fp32 [B*W or B, V]: new cum, done and hypotheses in place;
  // returns the new beams' (parents, tokens, token_log_probs) [B, W].
  m.def(
      "beam_search_step(Tensor log_probs, Tensor input_lengths, Tensor end_ids, "
      "Tensor output_ids, Tensor run_log_probs, Tensor gen_len, Tensor(a!) cum_log_probs, "
      "Tensor(b!) done, Tensor(c!) hyp_count, Tensor(d!) hyp_score, Tensor(e!) hyp_cum, "
      "Tensor(f!) hyp_len, Tensor(g!) hyp_ids, Tensor(h!) hyp_log_probs, "
      "float length_penalty=1.0, float diversity_rate=0.0) -> (Tensor parents, Tensor tokens, "
      "Tensor token_log_probs)");
  // Reorder the running rows (ids, cache indirection, log probs) by parent, append the tokens.
  m.def(
      "beam_search_update(Tensor parents, Tensor tokens, Tensor token_log_probs, "
      "Tensor input_lengths, Tensor(a!) gen_len, Tensor(b!) output_ids, Tensor(c!) cache_indir, "
      "Tensor(d!) run_log_probs, Tensor(e!) cur_pos, Tensor(f!) attn_len) -> ()");
  // The W best hypotheses per entry, best first (running beams join unless the entry is done).
  m.def(
      "beam_search_finalize(Tensor input_lengths, Tensor end_ids, Tensor output_ids, "
      "Tensor run_log_probs, Tensor cum_log_probs, Tensor gen_len, Tensor done, "
      "Tensor hyp_count, Tensor hyp_score, Tensor hyp_cum, Tensor hyp_len, Tensor hyp_ids, "
      "Tensor hyp_log_probs, float length_penalty=1.0, int out_stride=-1) -> "
      "(Tensor output_ids, Tensor sequence_lengths, Tensor cum_log_probs, Tensor scores, "
      "Tensor output_log_probs)");

  // ---- classes ----
  // One member of an NCCL group (tensor- or pipeline-parallel); joins with a timeout.
  m.class_<warpformer::NcclCommHolder>("NcclComm")
      .def(torch::init<at::Tensor, int64_t, int64_t, int64_t, double, bool>(), "",
           {torch::arg("unique_id"), torch::arg("world_size"), torch::arg("rank"),
            torch::arg("device"), torch::arg("timeout_s") = 300.0,
            torch::arg("peer_allreduce") = true})
      .def("rank", &warpformer::NcclCommHolder::rank)
      .def("size", &warpformer::NcclCommHolder::size)
      .def("device", &warpformer::NcclCommHolder::device)
      .def("all_reduce_", &warpformer::NcclCommHolder::all_reduce_, "",
           {torch::arg("t"), torch::arg("path") = std::string("auto")})
      .def("all_reduce_group_", &warpformer::NcclCommHolder::all_reduce_group_, "",
           {torch::arg("ts"), torch::arg("path") = std::string("auto")})
      .def("peer_all_reduce", &warpformer::NcclCommHolder::peer_all_reduce)
      .def("peer_all_reduce_reason", &warpformer::NcclCommHolder::peer_all_reduce_reason)
      .def("barrier", &warpformer::NcclCommHolder::barrier)
      .def("abort", &warpformer::NcclCommHolder::abort);

  // A GPT-family model instance on one GPU (one TP/PP rank): weights by name, KV cache, greedy
  // generation on the device. Pickles as (config, weights, options), the JSON texts it was
  // built from (ModelOptions).
  m.class_<GptModelHolder>("GptModel")
      .def(torch::init<std::string, c10::Dict<std::string, at::Tensor>, std::string>(), "",
           {torch::arg("config"), torch::arg("weights"), torch::arg("options") = std::string("{}")})
      .def("forward", &GptModelHolder::forward, "",
           {torch::arg("input_ids"), torch::arg("input_lengths")})
      .def("generate", &GptModelHolder::generate, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("end_id") = -1})
      .def("decode", &GptModelHolder::decode, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("options")})
      .def("decode_start", &GptModelHolder::decode_start, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("options")})
      .def("decode_step", &GptModelHolder::decode_step, "", {torch::arg("max_steps")})
      .def("decode_finish", &GptModelHolder::decode_finish)
      .def("open_session", &GptModelHolder::open_session, "",
           {torch::arg("batch"), torch::arg("max_len")})
      .def("close_session", &GptModelHolder::close_session, "", {torch::arg("handle")})
      .def("attach_tensor_parallel", &GptModelHolder::attach_tensor_parallel)
      .def("attach_pipeline_parallel", &GptModelHolder::attach_pipeline_parallel)
      .def("config", &GptModelHolder::config)
      .def("options", &GptModelHolder::options)
      .def("tensor_para_size", &GptModelHolder::tensor_para_size)
      .def("pipeline_para_size", &GptModelHolder::pipeline_para_size)
      .def("dtype", &GptModelHolder::dtype)
      .def("max_batch", &GptModelHolder::max_batch)
      .def("max_seq_len", &GptModelHolder::max_seq_len)
      .def("vocab_size", &GptModelHolder::vocab_size)
      .def("device", &GptModelHolder::device)
      .def("memory_bytes", &GptModelHolder::memory_bytes)
      .def("gemm_workspace_bytes", &GptModelHolder::gemm_workspace_bytes)
      .def("gemm_tuned_shapes", &GptModelHolder::gemm_tuned_shapes)
      .def("gemm_tuned_plans", &GptModelHolder::gemm_tuned_plans)
      .def("gemm_cached_plans", &GptModelHolder::gemm_cached_plans)
      .def("gemm_plan_shapes", &GptModelHolder::gemm_plan_shapes)
      .def("gemm_heuristic_queries", &GptModelHolder::gemm_heuristic_queries)
      .def("gemm_tuning_note", &GptModelHolder::gemm_tuning_note)
      .def("prompt_graph_stats", &GptModelHolder::prompt_graph_stats)
      .def_pickle([](const c10::intrusive_ptr<GptModelHolder>& self) { return self->get_state(); },
                  [](GptModelHolder::State s) {
                    return c10::make_intrusive<GptModelHolder>(std::get<0>(s), std::get<1>(s),
                                                               std::get<2>(s));
                  });

  // An encoder-decoder instance (T5 / BART families) on one GPU (one TP rank): encode, and
  // generation from the encoder inputs with GptModel.decode's options.
  m.class_<Seq2SeqModelHolder>("Seq2SeqModel")
      .def(torch::init<std::string, c10::Dict<std::string, at::Tensor>, std::string>(), "",
           {torch::arg("config"), torch::arg("weights"), torch::arg("options") = std::string("{}")})
      .def("encode", &Seq2SeqModelHolder::encode, "",
           {torch::arg("input_ids"), torch::arg("input_lengths")})
      .def("decode", &Seq2SeqModelHolder::decode, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("options")})
      .def("decode_start", &Seq2SeqModelHolder::decode_start, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("options")})
      .def("decode_step", &Seq2SeqModelHolder::decode_step, "", {torch::arg("max_steps")})
      .def("decode_finish", &Seq2SeqModelHolder::decode_finish)
      .def("attach_tensor_parallel", &Seq2SeqModelHolder::attach_tensor_parallel)
      .def("config", &Seq2SeqModelHolder::config)
      .def("options", &Seq2SeqModelHolder::options)
      .def("tensor_para_size", &Seq2SeqModelHolder::tensor_para_size)
      .def("dtype", &Seq2SeqModelHolder::dtype)
      .def("max_batch", &Seq2SeqModelHolder::max_batch)
      .def("max_seq_len", &Seq2SeqModelHolder::max_seq_len)
      .def("vocab_size", &Seq2SeqModelHolder::vocab_size)
      .def("device", &Seq2SeqModelHolder::device)
      .def("memory_bytes", &Seq2SeqModelHolder::memory_bytes)
      .def("gemm_plan_shapes", &Seq2SeqModelHolder::gemm_plan_shapes)
      .def("gemm_tuned_shapes", &Seq2SeqModelHolder::gemm_tuned_shapes)
      .def_pickle(
          [](const c10::intrusive_ptr<Seq2SeqModelHolder>& self) { return self->get_state(); },
          [](Seq2SeqModelHolder::State s) {
            return c10::make_intrusive<Seq2SeqModelHolder>(std::get<0>(s), std::get<1>(s),
                                                           std::get<2>(s));
          });
}

#define WF_IMPL_ALL(m)                                             \
  m.impl("layer_norm", &wo::layer_norm);                           \
  m.impl("rms_norm", &wo::rms_norm);                               \
  m.impl("add_layer_norm", &wo::add_layer_norm);                   \
  m.impl("add_rms_norm", &wo::add_rms_norm);                       \
  m.impl("bias_act", &wo::bias_act);                               \
  m.impl("gated_act", &wo::gated_act);                             \
  m.impl("embedding", &wo::embedding);                             \
  m.impl("scatter_rows_to_columns", &wo::scatter_rows_to_columns); \
  m.impl("qkv_rotary_cache", &wo::qkv_rotary_cache);               \
  m.impl("kv_cache_write", &wo::kv_cache_write);                   \
  m.impl("context_attention", &wo::context_attention);             \
  m.impl("decode_attention", &wo::decode_attention);               \
  m.impl("decode_attention_fused", &wo::decode_attention_fused);   \
  m.impl("gemm", &wo::gemm);                                       \
  m.impl("norm_gemm", &wo::norm_gemm);                             \
  m.impl("norm_gemm_pair", &wo::norm_gemm_pair);                   \
  m.impl("gemm_sum", &wo::gemm_sum);                               \
  m.impl("gemm_benchmark", &wo::gemm_benchmark);                   \
  m.impl("gemm_quant", &wo::gemm_quant);                           \
  m.impl("dequantize_weight", &wo::dequantize_weight);             \
  m.impl("beam_log_softmax", &wo::beam_log_softmax);               \
  m.impl("beam_search_init", &wo::beam_search_init);               \
  m.impl("beam_search_step", &wo::beam_search_step);               \
  m.impl("beam_search_update", &wo::beam_search_update);           \
  m.impl("beam_search_finalize", &wo::beam_search_finalize);       \
  m.impl("count_tokens", &wo::count_tokens);                       \
  m.impl("add_token_counts", &wo::add_token_counts);               \
  m.impl("process_logits", &wo::process_logits);                   \
  m.impl("sample_tokens", &wo::sample_tokens);                     \
  m.impl("greedy_tokens", &wo::greedy_tokens);                     \
  m.impl("update_tokens", &wo::update_tokens);

TORCH_LIBRARY_IMPL(warpformer, CUDA, m) { WF_IMPL_ALL(m); }
TORCH_LIBRARY_IMPL(warpformer, CPU, m) { WF_IMPL_ALL(m); }
// No tensor arguments: the dispatcher falls back to the CompositeExplicitAutograd kernel.
TORCH_LIBRARY_IMPL(warpformer, CompositeExplicitAutograd, m) {
  m.impl("alibi_slopes", &wo::alibi_slopes);
  m.impl("gemm_fingerprint", &wo::gemm_fingerprint);
  m.impl("nccl_unique_id", &wo::nccl_unique_id);
  m.impl("gpt_weight_table", &wo::gpt_weight_table);
  m.impl("t5_weight_table", &wo::t5_weight_table);
  m.impl("generation_options", &wo::generation_options);
}

// `import warpformer._C` needs a module object; the registrations above run when the shared
// library is loaded, before this is called.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C",
                            "warpformer CUDA ops and classes (see torch.ops.warpformer)", -1,
                            nullptr};
  return PyModule_Create(&def);
}

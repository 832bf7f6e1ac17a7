// The single registration file: every torch.ops.warpformer op (schema beside its one-line
// description) and every torch.classes.warpformer class, plus the Python module entry point.
//
// Ops are registered for the CUDA and the CPU dispatch keys with the same implementation: on CPU
// tensors it validates the arguments and then fails with a message that says the op needs a GPU,
// instead of the dispatcher's generic "could not run with arguments from the CPU backend".
// Fake (meta) implementations for torch.compile live in python/warpformer/_ops.py.
#include <Python.h>
#include <torch/library.h>

#include "csrc/torch/gpt_class.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/ops_attention.h"

namespace wo = warpformer::ops;
using warpformer::GptModelHolder;

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
  // wte[ids] * scale (+ wpe[positions]); ids int32 [N] or [B, S]; bad ids raise, never read OOB.
  m.def(
      "embedding(Tensor input_ids, Tensor wte, Tensor? wpe=None, Tensor? position_ids=None, "
      "float scale=1.0) -> Tensor");

  // ---- GEMM (csrc/core/gemm) ----
  // out = input @ weight (weight [k, n], or [n, k] when transposed) (+ bias, epilogue) via cuBLASLt.
  m.def(
      "gemm(Tensor input, Tensor weight, Tensor? bias=None, bool transposed=False, "
      "str epilogue='none') -> Tensor");
  // Median us of each of cuBLASLt's first max_algos candidates for this shape (gemm-tune).
  m.def(
      "gemm_benchmark(Tensor input, Tensor weight, Tensor? bias, bool transposed, str epilogue, "
      "bool accumulate, int max_algos, int reps) -> Tensor");
  // "gpu=<name>;cublaslt=<version>": what a tuning file is valid for.
  m.def("gemm_fingerprint(int device=0) -> str");

  // ---- attention (kernels/attention) ----
  // q = rotary(qkv[:, 0] + b); k = rotary(qkv[:, 1] + b), v = qkv[:, 2] + b written in place into
  // k_cache/v_cache [slots, heads, max_seq, head_dim] at (token_slot[t], :, token_pos[t]).
  // rotary_style: 'none' | 'interleaved' (GPT-J) | 'half' (GPT-NeoX).
  m.def(
      "qkv_rotary_cache(Tensor qkv, Tensor? bias, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor token_slot, Tensor token_pos, int rotary_dim, str rotary_style, "
      "float rotary_base) -> Tensor");
  // Causal attention of packed sequences q [tokens, heads, head_dim] (cu_seqlens) against
  // positions 0..len-1 of cache slot seq_slot[b]; optional ALiBi slopes [heads] (fp32).
  m.def(
      "context_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens, "
      "Tensor seq_slot, Tensor? alibi_slopes, float scale, int max_seqlen) -> Tensor");
  // One query per row q [rows, heads, head_dim] against lengths[r] cache positions of slot
  // row_slot[r] (or cache_indir[r, p] per position); split-KV for long caches.
  m.def(
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? row_slot, "
      "Tensor lengths, Tensor? cache_indir, Tensor? alibi_slopes, float scale) -> Tensor");
  // HF BLOOM ALiBi slopes for num_heads heads (all ranks), float32 CPU tensor [num_heads].
  m.def("alibi_slopes(int num_heads) -> Tensor");

  // ---- classes ----
  // A GPT-family model instance on one GPU (one TP/PP rank): weights by name, KV cache, greedy
  // generation on the device. Pickles as (config, weights, limits, dtype, ranks, gemm_config).
  m.class_<GptModelHolder>("GptModel")
      .def(torch::init<std::string, c10::Dict<std::string, at::Tensor>, int64_t, int64_t,
                       std::string, int64_t, int64_t, int64_t, std::string>(),
           "", {torch::arg("config"), torch::arg("weights"), torch::arg("max_batch") = 8,
                torch::arg("max_seq_len") = 1024, torch::arg("dtype") = std::string(),
                torch::arg("tensor_para_rank") = 0, torch::arg("pipeline_para_size") = 1,
                torch::arg("pipeline_para_rank") = 0, torch::arg("gemm_config") = std::string()})
      .def("forward", &GptModelHolder::forward, "",
           {torch::arg("input_ids"), torch::arg("input_lengths")})
      .def("generate", &GptModelHolder::generate, "",
           {torch::arg("input_ids"), torch::arg("input_lengths"), torch::arg("output_len"),
            torch::arg("end_id") = -1})
      .def("config", &GptModelHolder::config)
      .def("dtype", &GptModelHolder::dtype)
      .def("max_batch", &GptModelHolder::max_batch)
      .def("max_seq_len", &GptModelHolder::max_seq_len)
      .def("vocab_size", &GptModelHolder::vocab_size)
      .def("device", &GptModelHolder::device)
      .def("memory_bytes", &GptModelHolder::memory_bytes)
      .def("gemm_tuned_shapes", &GptModelHolder::gemm_tuned_shapes)
      .def_pickle(
          [](const c10::intrusive_ptr<GptModelHolder>& self) { return self->get_state(); },
          [](GptModelHolder::State s) {
            return c10::make_intrusive<GptModelHolder>(
                std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s), std::get<4>(s),
                std::get<5>(s), std::get<6>(s), std::get<7>(s), std::get<8>(s));
          });
}

#define WF_IMPL_ALL(m)                             \
  m.impl("layer_norm", &wo::layer_norm);           \
  m.impl("rms_norm", &wo::rms_norm);               \
  m.impl("add_layer_norm", &wo::add_layer_norm);   \
  m.impl("add_rms_norm", &wo::add_rms_norm);       \
  m.impl("bias_act", &wo::bias_act);               \
  m.impl("gated_act", &wo::gated_act);             \
  m.impl("embedding", &wo::embedding);             \
  m.impl("qkv_rotary_cache", &wo::qkv_rotary_cache); \
  m.impl("context_attention", &wo::context_attention); \
  m.impl("decode_attention", &wo::decode_attention);   \
  m.impl("gemm", &wo::gemm);                           \
  m.impl("gemm_benchmark", &wo::gemm_benchmark);

TORCH_LIBRARY_IMPL(warpformer, CUDA, m) { WF_IMPL_ALL(m) }
TORCH_LIBRARY_IMPL(warpformer, CPU, m) { WF_IMPL_ALL(m) }
// No tensor arguments: the dispatcher falls back to the CompositeExplicitAutograd kernel.
TORCH_LIBRARY_IMPL(warpformer, CompositeExplicitAutograd, m) {
  m.impl("alibi_slopes", &wo::alibi_slopes);
  m.impl("gemm_fingerprint", &wo::gemm_fingerprint);
}

// `import warpformer._C` needs a module object; the registrations above run when the shared
// library is loaded, before this is called.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C",
                            "warpformer CUDA ops and classes (see torch.ops.warpformer)", -1,
                            nullptr};
  return PyModule_Create(&def);
}

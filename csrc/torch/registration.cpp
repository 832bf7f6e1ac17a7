// The single registration file: every torch.ops.warpformer op (schema beside its one-line
// description) and every torch.classes.warpformer class, plus the Python module entry point.
//
// Ops are registered for the CUDA and the CPU dispatch keys with the same implementation: on CPU
// tensors it validates the arguments and then fails with a message that says the op needs a GPU,
// instead of the dispatcher's generic "could not run with arguments from the CPU backend".
// Fake (meta) implementations for torch.compile live in python/warpformer/_ops.py.
#include <Python.h>
#include <torch/library.h>

#include "csrc/torch/ops.h"

namespace wo = warpformer::ops;

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
}

#define WF_IMPL_ALL(m)                             \
  m.impl("layer_norm", &wo::layer_norm);           \
  m.impl("rms_norm", &wo::rms_norm);               \
  m.impl("add_layer_norm", &wo::add_layer_norm);   \
  m.impl("add_rms_norm", &wo::add_rms_norm);       \
  m.impl("bias_act", &wo::bias_act);               \
  m.impl("gated_act", &wo::gated_act);             \
  m.impl("embedding", &wo::embedding);

TORCH_LIBRARY_IMPL(warpformer, CUDA, m) { WF_IMPL_ALL(m) }
TORCH_LIBRARY_IMPL(warpformer, CPU, m) { WF_IMPL_ALL(m) }

// `import warpformer._C` needs a module object; the registrations above run when the shared
// library is loaded, before this is called.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C",
                            "warpformer CUDA ops and classes (see torch.ops.warpformer)", -1,
                            nullptr};
  return PyModule_Create(&def);
}

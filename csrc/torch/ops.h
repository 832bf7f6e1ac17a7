// Stateless torch ops (implementations in ops_*.cpp, schemas in registration.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <tuple>

namespace warpformer {
namespace ops {

using OptTensor = c10::optional<at::Tensor>;

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                      double eps);
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps);
at::Tensor add_layer_norm(const at::Tensor& input, at::Tensor& residual,
                          const OptTensor& input_bias, const at::Tensor& weight,
                          const OptTensor& bias, double eps);
at::Tensor add_rms_norm(const at::Tensor& input, at::Tensor& residual, const OptTensor& input_bias,
                        const at::Tensor& weight, double eps);

at::Tensor bias_act(const at::Tensor& input, const OptTensor& bias, const std::string& activation);
at::Tensor gated_act(const at::Tensor& input, const OptTensor& bias, const std::string& activation);

at::Tensor embedding(const at::Tensor& input_ids, const at::Tensor& wte, const OptTensor& wpe,
                     const OptTensor& position_ids, double scale, const OptTensor& extra);
// dst[r, index[r] + offset - base[r]] = src[r] in place (kernels::launch_scatter_rows_to_columns):
// the engine's writes of decode steps' hidden states, a column per row from the device state.
void scatter_rows_to_columns(at::Tensor& dst, const at::Tensor& src, const at::Tensor& index,
                             const OptTensor& base, const OptTensor& skip, int64_t offset);

// out[m, n] = input[m, k] @ weight[k, n] (weight [n, k] when transposed) through cuBLASLt.
at::Tensor gemm(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                bool transposed, const std::string& epilogue, const std::string& backend,
                const OptTensor& residual);
// (act(norm(x) @ weight + bias), x, norm(x)) with x = input (+ input_bias) (+ residual): the
// GEMV that normalises its own input (backend 'fused') or a norms kernel and the product.
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_gemm(
    const at::Tensor& input, const OptTensor& residual, const OptTensor& input_bias,
    const at::Tensor& norm_weight, const OptTensor& norm_bias, const std::string& norm, double eps,
    const at::Tensor& weight, const OptTensor& bias, const std::string& activation,
    const std::string& backend);
// (act(norm(x) @ weight + bias), act2(norm2(x) @ weight2 + bias2), x): two products of one
// normalised input, norm2 using norm_weight2 / norm_bias2 when given; one GEMV launch (backend
// 'joined', kernels::launch_gemv_normed_pair) or each product alone ('separate').
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_gemm_pair(
    const at::Tensor& input, const OptTensor& residual, const OptTensor& input_bias,
    const at::Tensor& norm_weight, const OptTensor& norm_bias, const std::string& norm, double eps,
    const at::Tensor& weight, const OptTensor& bias, const std::string& activation,
    const at::Tensor& weight2, const OptTensor& bias2, const std::string& activation2,
    const OptTensor& norm_weight2, const OptTensor& norm_bias2, const std::string& backend);
// input @ weight + input2 @ weight2: one GEMV launch over both depths (backend 'joined',
// kernels::launch_gemv_sum) or two products, the second accumulating ('separate').
at::Tensor gemm_sum(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& input2,
                    const at::Tensor& weight2, const std::string& backend);
// act(input @ dequant(weight) + bias) for a weight-only quantized weight (docs/FORMAT.md: int8
// weight + scale [n]; int4 uint8 weight [k / 2, n] + scale (+ zero) [k / group_size, n]) through
// layers::linear_forward. backend: auto (the quantized GEMV up to 8 rows, else dequantize + GEMM),
// gemv, or dequant.
at::Tensor gemm_quant(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& scale,
                      const OptTensor& zero, const OptTensor& bias, int64_t group_size,
                      const std::string& epilogue, const std::string& backend);
// The dense [k, n] weight of scale's dtype (the kernel the many-row products use).
at::Tensor dequantize_weight(const at::Tensor& weight, const at::Tensor& scale,
                             const OptTensor& zero, int64_t group_size);
// Median microseconds of each of cuBLASLt's first max_algos heuristic candidates for the shape.
at::Tensor gemm_benchmark(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                          bool transposed, const std::string& epilogue, bool accumulate,
                          int64_t max_algos, int64_t reps);
// GPU name and cuBLASLt version a tuning file is valid for.
std::string gemm_fingerprint(int64_t device);
// A new NCCL unique id, uint8 [128] on the CPU (made by one rank, shared with its group).
at::Tensor nccl_unique_id();
// The weight table of a GPT-family config (GptConfig JSON) as JSON: csrc/models/gpt/gpt_weights.h.
std::string gpt_weight_table(const std::string& config);
// The weight table of an encoder-decoder config (T5Config JSON: T5 and BART families) as JSON:
// csrc/models/t5/t5_weights.h (t5_ops.cpp).
std::string t5_weight_table(const std::string& config);

// Argument checks shared by the norm ops (ops_elementwise.cpp) and norm_gemm (ops_gemm.cpp), each
// op calling them in its own order. Dtype and shape only (each op checks devices afterwards);
// messages name `op` and the argument.
//
// A norm's vector operand (gamma, beta, input_bias), when given: input's dtype, 1-dimensional,
// input.size(-1) elements; `hidden` names that size in the message ("input's last dimension").
void check_norm_vector(const char* op, const at::Tensor& input, const OptTensor& t,
                       const char* name, const char* hidden);
// An add-norm's residual: input's dtype and shape.
void check_norm_residual(const char* op, const at::Tensor& input, const at::Tensor& residual);

}  // namespace ops
}  // namespace warpformer

// Stateless torch ops (implementations in ops_*.cpp, schemas in registration.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>

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
at::Tensor gated_act(const at::Tensor& input, const OptTensor& bias,
                     const std::string& activation);

at::Tensor embedding(const at::Tensor& input_ids, const at::Tensor& wte, const OptTensor& wpe,
                     const OptTensor& position_ids, double scale);

}  // namespace ops
}  // namespace warpformer

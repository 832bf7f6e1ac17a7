// Torch ops for the norm, activation and embedding kernel families, and the row moves of
// kernels/gather.h the engine scatters outputs with: argument checks, dtype dispatch, launch on
// PyTorch's current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <sstream>

#include "csrc/core/activation.h"
#include "csrc/core/check.h"
#include "csrc/torch/ops.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"
#include "kernels/norms.h"

namespace warpformer {
namespace ops {

void check_norm_vector(const char* op, const at::Tensor& input, const OptTensor& t,
                       const char* name, const char* hidden) {
  if (!t.has_value()) return;
  check_dtype(*t, input.scalar_type(), op, name, "the dtype of input");
  check_dim(*t, 1, op, name);
  check_size(*t, 0, input.size(-1), op, name, hidden);
}

void check_norm_residual(const char* op, const at::Tensor& input, const at::Tensor& residual) {
  check_dtype(residual, input.scalar_type(), op, "residual", "the dtype of input");
  TORCH_CHECK(residual.sizes() == input.sizes(), op, ": residual must have input's shape ",
              input.sizes(), ", got ", residual.sizes());
}

namespace {

// Dtype/shape checks shared by the norm ops (device checks follow in run_norm).
void check_norm_args(const char* op, const at::Tensor& input, const at::Tensor& weight,
                     const OptTensor& bias, const char* bias_name, double eps) {
  check_floating(input, op, "input");
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least 1 dimension, got a scalar");
  TORCH_CHECK(input.size(-1) > 0, op, ": input's last dimension (hidden size) must be > 0");
  TORCH_CHECK(input.size(-1) <= INT32_MAX, op, ": hidden size ", input.size(-1), " exceeds 2^31-1");
  TORCH_CHECK(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
  check_norm_vector(op, input, weight, "weight", "input's last dimension");
  check_norm_vector(op, input, bias, bias_name, "input's last dimension");
}

at::Tensor run_norm(const char* op, kernels::NormKind kind, const at::Tensor& input,
                    at::Tensor* residual, const OptTensor& input_bias, const at::Tensor& weight,
                    const OptTensor& bias, double eps) {
  check_norm_args(op, input, weight, bias, "bias", eps);
  if (residual != nullptr) {
    check_norm_residual(op, input, *residual);
    check_contiguous(*residual, op, "residual");
  }
  check_norm_vector(op, input, input_bias, "input_bias", "input's last dimension");
  check_cuda(input, op, "input");
  check_cuda(weight, op, "weight", input, "input");
  if (bias.has_value()) check_cuda(*bias, op, "bias", input, "input");
  if (residual != nullptr) check_cuda(*residual, op, "residual", input, "input");
  if (input_bias.has_value()) check_cuda(*input_bias, op, "input_bias", input, "input");
  const at::Tensor x = input.contiguous();
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out = at::empty_like(x);
  const at::Tensor w = weight.contiguous();
  const OptTensor b = bias.has_value() ? OptTensor(bias->contiguous()) : OptTensor();
  const OptTensor ib = input_bias.has_value() ? OptTensor(input_bias->contiguous()) : OptTensor();
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "input"), op, [&] {
    kernels::NormParams<scalar_t> p{};
    p.out = reinterpret_cast<scalar_t*>(out.data_ptr());
    p.residual_out = residual ? reinterpret_cast<scalar_t*>(residual->data_ptr()) : nullptr;
    p.input = reinterpret_cast<const scalar_t*>(x.data_ptr());
    p.residual = residual ? reinterpret_cast<const scalar_t*>(residual->data_ptr()) : nullptr;
    p.input_bias = ptr_or_null<const scalar_t>(ib);
    p.gamma = reinterpret_cast<const scalar_t*>(w.data_ptr());
    p.beta = ptr_or_null<const scalar_t>(b);
    p.rows = leading_rows(x);
    p.hidden = static_cast<int>(x.size(-1));
    p.eps = static_cast<float>(eps);
    p.kind = kind;
    WF_CUDA_CHECK(kernels::launch_norm(p, current_stream(x)));
  });
  return out;
}

at::Tensor run_act(const char* op, bool gated, const at::Tensor& input, const OptTensor& bias,
                   const std::string& activation) {
  check_floating(input, op, "input");
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least 1 dimension, got a scalar");
  const int64_t in_cols = input.size(-1);
  TORCH_CHECK(in_cols > 0 && in_cols <= INT32_MAX, op,
              ": input's last dimension must be in [1, 2^31), got ", in_cols);
  if (gated) {
    TORCH_CHECK(in_cols % 2 == 0, op,
                ": input's last dimension must be even (gate half, then linear half), got ",
                in_cols);
  }
  const kernels::Activation act = parse_activation(activation, "activation");
  if (bias.has_value()) {
    check_dtype(*bias, input.scalar_type(), op, "bias", "the dtype of input");
    check_dim(*bias, 1, op, "bias");
    check_size(*bias, 0, in_cols, op, "bias", "input's last dimension");
  }
  check_cuda(input, op, "input");
  if (bias.has_value()) check_cuda(*bias, op, "bias", input, "input");

  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  const OptTensor b = bias.has_value() ? OptTensor(bias->contiguous()) : OptTensor();
  const int cols = static_cast<int>(gated ? in_cols / 2 : in_cols);
  auto out_shape = x.sizes().vec();
  out_shape.back() = cols;
  at::Tensor out = at::empty(out_shape, x.options());
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "input"), op, [&] {
    auto* o = reinterpret_cast<scalar_t*>(out.data_ptr());
    const auto* i = reinterpret_cast<const scalar_t*>(x.data_ptr());
    const auto* bp = ptr_or_null<const scalar_t>(b);
    const int64_t rows = leading_rows(x);
    if (gated) {
      WF_CUDA_CHECK(kernels::launch_gated_act(o, i, bp, rows, cols, act, current_stream(x)));
    } else {
      WF_CUDA_CHECK(kernels::launch_bias_act(o, i, bp, rows, cols, act, current_stream(x)));
    }
  });
  return out;
}

}  // namespace

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const OptTensor& bias,
                      double eps) {
  return run_norm("warpformer.layer_norm", kernels::NormKind::kLayerNorm, input, nullptr,
                  OptTensor(), weight, bias, eps);
}

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  return run_norm("warpformer.rms_norm", kernels::NormKind::kRmsNorm, input, nullptr, OptTensor(),
                  weight, OptTensor(), eps);
}

at::Tensor add_layer_norm(const at::Tensor& input, at::Tensor& residual,
                          const OptTensor& input_bias, const at::Tensor& weight,
                          const OptTensor& bias, double eps) {
  return run_norm("warpformer.add_layer_norm", kernels::NormKind::kLayerNorm, input, &residual,
                  input_bias, weight, bias, eps);
}

at::Tensor add_rms_norm(const at::Tensor& input, at::Tensor& residual, const OptTensor& input_bias,
                        const at::Tensor& weight, double eps) {
  return run_norm("warpformer.add_rms_norm", kernels::NormKind::kRmsNorm, input, &residual,
                  input_bias, weight, OptTensor(), eps);
}

at::Tensor bias_act(const at::Tensor& input, const OptTensor& bias, const std::string& activation) {
  return run_act("warpformer.bias_act", false, input, bias, activation);
}

at::Tensor gated_act(const at::Tensor& input, const OptTensor& bias,
                     const std::string& activation) {
  return run_act("warpformer.gated_act", true, input, bias, activation);
}

at::Tensor embedding(const at::Tensor& input_ids, const at::Tensor& wte, const OptTensor& wpe,
                     const OptTensor& position_ids, double scale, const OptTensor& extra) {
  const char* op = "warpformer.embedding";
  check_dtype(input_ids, at::kInt, op, "input_ids");
  check_dim_in(input_ids, {1, 2}, op, "input_ids");
  check_floating(wte, op, "wte");
  check_dim(wte, 2, op, "wte");
  TORCH_CHECK(wte.size(0) > 0 && wte.size(1) > 0, op, ": wte must be non-empty, got shape ",
              wte.sizes());
  TORCH_CHECK(wte.size(0) <= INT32_MAX && wte.size(1) <= INT32_MAX, op,
              ": wte dimensions must be < 2^31, got ", wte.sizes());
  TORCH_CHECK(input_ids.numel() <= INT32_MAX, op, ": input_ids has more than 2^31-1 tokens");
  if (wpe.has_value()) {
    check_dtype(*wpe, wte.scalar_type(), op, "wpe", "the dtype of wte");
    check_dim(*wpe, 2, op, "wpe");
    check_size(*wpe, 1, wte.size(1), op, "wpe", "the hidden size of wte");
    TORCH_CHECK(wpe->size(0) > 0, op, ": wpe must have at least one position row");
  }
  if (position_ids.has_value()) {
    TORCH_CHECK(wpe.has_value(), op, ": position_ids given but wpe is None");
    check_dtype(*position_ids, at::kInt, op, "position_ids");
    TORCH_CHECK(position_ids->sizes() == input_ids.sizes(), op,
                ": position_ids must have input_ids's shape ", input_ids.sizes(), ", got ",
                position_ids->sizes());
  }
  if (extra.has_value()) {
    check_dtype(*extra, wte.scalar_type(), op, "extra", "the dtype of wte");
    check_dim(*extra, 2, op, "extra");
    check_size(*extra, 1, wte.size(1), op, "extra", "the hidden size of wte");
    TORCH_CHECK(wte.size(0) + extra->size(0) <= INT32_MAX, op,
                ": wte and extra rows must number < 2^31, got ", wte.size(0) + extra->size(0));
  }
  check_cuda(input_ids, op, "input_ids");
  check_cuda(wte, op, "wte", input_ids, "input_ids");
  if (extra.has_value()) check_cuda(*extra, op, "extra", input_ids, "input_ids");
  if (wpe.has_value()) check_cuda(*wpe, op, "wpe", input_ids, "input_ids");
  if (position_ids.has_value()) {
    check_cuda(*position_ids, op, "position_ids", input_ids, "input_ids");
  }

  const c10::cuda::CUDAGuard guard(input_ids.device());
  const at::Tensor ids = input_ids.contiguous();
  const at::Tensor table = wte.contiguous();
  const OptTensor rows = extra.has_value() ? OptTensor(extra->contiguous()) : OptTensor();
  const OptTensor pos_table = wpe.has_value() ? OptTensor(wpe->contiguous()) : OptTensor();
  const OptTensor pos =
      position_ids.has_value() ? OptTensor(position_ids->contiguous()) : OptTensor();
  auto out_shape = ids.sizes().vec();
  out_shape.push_back(table.size(1));
  at::Tensor out = at::empty(out_shape, table.options());
  at::Tensor errors =
      at::full({2}, kernels::EmbeddingErrors::kNoError, ids.options().dtype(at::kInt));
  WF_DISPATCH_FLOATING(to_dtype(table.scalar_type(), op, "wte"), op, [&] {
    kernels::EmbeddingParams<scalar_t> p{};
    p.out = reinterpret_cast<scalar_t*>(out.data_ptr());
    p.ids = ids.data_ptr<int32_t>();
    p.wte = reinterpret_cast<const scalar_t*>(table.data_ptr());
    p.wpe = ptr_or_null<const scalar_t>(pos_table);
    p.positions = pos.has_value() ? pos->data_ptr<int32_t>() : nullptr;
    p.errors = reinterpret_cast<kernels::EmbeddingErrors*>(errors.data_ptr<int32_t>());
    p.tokens = ids.numel();
    p.hidden = static_cast<int>(table.size(1));
    p.vocab = static_cast<int>(table.size(0));
    p.max_positions = pos_table.has_value() ? static_cast<int>(pos_table->size(0)) : 0;
    p.seq_len = static_cast<int>(ids.size(-1));
    p.scale = static_cast<float>(scale);
    p.extra = ptr_or_null<const scalar_t>(rows);
    p.extra_rows = rows.has_value() ? static_cast<int>(rows->size(0)) : 0;
    WF_CUDA_CHECK(kernels::launch_embedding(p, current_stream(ids)));
  });
  // One small device-to-host copy: the kernel has already zeroed bad rows instead of reading out
  // of bounds; this turns the recorded index into an error naming the offending token.
  const at::Tensor err = errors.to(at::kCPU);
  const int32_t bad_tok = err.data_ptr<int32_t>()[0];
  const int32_t bad_pos = err.data_ptr<int32_t>()[1];
  if (bad_tok != kernels::EmbeddingErrors::kNoError) {
    const at::Tensor host_ids = ids.reshape({-1}).to(at::kCPU);
    const int64_t value = host_ids.data_ptr<int32_t>()[bad_tok];
    std::ostringstream msg;
    msg << op << ": input_ids contains " << value << " at flat index " << bad_tok
        << ", outside the vocabulary [0, " << table.size(0) << ")";
    if (rows.has_value())
      msg << " and the extra rows [" << table.size(0) << ", " << table.size(0) + rows->size(0)
          << ")";
    TORCH_CHECK(false, msg.str());
  }
  if (bad_pos != kernels::EmbeddingErrors::kNoError) {
    int64_t value = bad_pos % ids.size(-1);
    if (pos.has_value()) value = pos->reshape({-1}).to(at::kCPU).data_ptr<int32_t>()[bad_pos];
    std::ostringstream msg;
    msg << op << ": position " << value << " of token at flat index " << bad_pos
        << " is outside the position table [0, " << pos_table->size(0) << ")"
        << (pos.has_value() ? " (from position_ids)" : " (sequence longer than wpe)");
    TORCH_CHECK(false, msg.str());
  }
  return out;
}

void scatter_rows_to_columns(at::Tensor& dst, const at::Tensor& src, const at::Tensor& index,
                             const OptTensor& base, const OptTensor& skip, int64_t offset) {
  const char* op = "warpformer.scatter_rows_to_columns";
  TORCH_CHECK(src.dim() >= 1 && dst.dim() == src.dim() + 1, op,
              ": dst must be [rows, columns, ...] and src [rows, ...] with the same trailing "
              "shape, got dst ",
              dst.sizes(), " and src ", src.sizes());
  TORCH_CHECK(dst.size(0) == src.size(0) && dst.sizes().slice(2) == src.sizes().slice(1), op,
              ": dst must be [rows, columns, ...] and src [rows, ...] with the same trailing "
              "shape, got dst ",
              dst.sizes(), " and src ", src.sizes());
  check_dtype(src, dst.scalar_type(), op, "src", "the dtype of dst");
  check_contiguous(dst, op, "dst");
  const int64_t rows = src.size(0);
  check_dtype(index, at::kInt, op, "index");
  check_dim(index, 1, op, "index");
  check_size(index, 0, rows, op, "index", "rows of src");
  for (const auto& [t, name] : {std::pair{&base, "base"}, std::pair{&skip, "skip"}}) {
    if (!t->has_value()) continue;
    check_dtype(**t, at::kInt, op, name);
    check_dim(**t, 1, op, name);
    check_size(**t, 0, rows, op, name, "rows of src");
  }
  TORCH_CHECK(offset >= INT32_MIN && offset <= INT32_MAX, op, ": offset must fit int32, got ",
              offset);
  check_cuda(dst, op, "dst");
  check_cuda(src, op, "src", dst, "dst");
  check_cuda(index, op, "index", dst, "dst");
  if (base.has_value()) check_cuda(*base, op, "base", dst, "dst");
  if (skip.has_value()) check_cuda(*skip, op, "skip", dst, "dst");

  const c10::cuda::CUDAGuard guard(dst.device());
  const at::Tensor s = src.contiguous(), i = index.contiguous();
  const OptTensor b = base.has_value() ? OptTensor(base->contiguous()) : OptTensor();
  const OptTensor k = skip.has_value() ? OptTensor(skip->contiguous()) : OptTensor();
  const int64_t row_bytes = rows > 0 ? s.numel() / rows * s.element_size() : 0;
  if (rows == 0 || row_bytes == 0) return;
  WF_CUDA_CHECK(kernels::launch_scatter_rows_to_columns(
      dst.data_ptr(), s.data_ptr(), i.data_ptr<int32_t>(), ptr_or_null<const int32_t>(b),
      static_cast<int32_t>(offset), ptr_or_null<const int32_t>(k), rows, dst.size(1), row_bytes,
      current_stream(dst)));
}

}  // namespace ops
}  // namespace warpformer

#include "csrc/layers/layer_spec.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace warpformer {
namespace layers {

void LayerSpec::check() const {
  TORCH_CHECK(hidden > 0 && heads > 0 && head_dim > 0 && inter > 0,
              "LayerSpec: hidden, heads, head_dim and inter must be positive, got ", hidden, ", ",
              heads, ", ", head_dim, ", ", inter);
  // Grouped-query attention: each K/V head serves heads / kv_heads query heads.
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "LayerSpec: kv_heads (", kv_heads,
              ") must divide heads (", heads, ")");
  TORCH_CHECK(norm != kernels::NormKind::kAddOnly, "LayerSpec: norm must be LayerNorm or RMSNorm");
  TORCH_CHECK(norm_eps >= 0.f, "LayerSpec: norm_eps must not be negative, got ", norm_eps);
  TORCH_CHECK(pre_norm() || mlp == MlpPlacement::kSequential,
              "LayerSpec: a post-norm block takes a sequential MLP");
  TORCH_CHECK(!gated || (pre_norm() && mlp == MlpPlacement::kSequential),
              "LayerSpec: a gated MLP runs in a pre-norm block with a sequential MLP");
  const bool rotary = position == PositionEncoding::kRotary;
  TORCH_CHECK(rotary == (rotary_dim > 0) && rotary == (rotary_style != kernels::RotaryStyle::kNone),
              "LayerSpec: rotary_dim and rotary_style are set exactly when position is rotary");
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= head_dim, "LayerSpec: rotary_dim (", rotary_dim,
              ") must be even and at most head_dim (", head_dim, ")");
  TORCH_CHECK(attn_scale >= 0.f, "LayerSpec: attn_scale must not be negative, got ", attn_scale);
  TORCH_CHECK(!cross_attention || (mlp == MlpPlacement::kSequential && kv_heads == heads),
              "LayerSpec: a cross-attention block takes a sequential MLP and multi-head attention");
}

float LayerSpec::score_scale() const {
  return attn_scale > 0.f ? attn_scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace layers
}  // namespace warpformer

// LayerSpec: what a transformer block is, as the layers read it (a model family's config maps onto
// it, csrc/models/<family>/), and Linear: one weight of a product, whatever its storage format.
// Sizes are this rank's: tensor parallelism has already divided the heads and the MLP width.
#pragma once

#include <cstdint>

#include "kernels/activations.h"
#include "kernels/attention/attention.h"
#include "kernels/norms.h"

namespace warpformer {
namespace layers {

// How a block orders its norms and residual adds.
enum class ResidualOrder {
  kPreNorm,   // x += attn(norm1(x)); x += mlp(norm2(x))
  kPostNorm,  // x = norm1(x + attn(x)); x = norm2(x + mlp(x))
};

// Where the MLP reads its input.
enum class MlpPlacement {
  kSequential,          // after the attention's residual add
  kParallel,            // beside the attention, from norm2(x) (GPT-NeoX)
  kParallelSharedNorm,  // beside the attention, from the attention's norm1(x) (GPT-J)
};

enum class PositionEncoding {
  kNone,
  kLearned,   // a table added to the token embedding (outside the block)
  kRotary,    // rotary_dim dimensions of q and k rotated in the attention
  kAlibi,     // linear biases on the attention scores, one slope per head
  kRelative,  // a learned bias per head and relative distance (T5), AttentionInputs::position_bias
};

struct LayerSpec {
  int64_t hidden = 0;    // the residual stream's width (not divided)
  int64_t heads = 0;     // query heads of this rank
  int64_t kv_heads = 0;  // key/value heads of this rank (== heads: multi-head attention)
  int64_t head_dim = 0;
  int64_t inter = 0;  // MLP width of this rank
  kernels::NormKind norm = kernels::NormKind::kLayerNorm;
  float norm_eps = 1e-5f;
  ResidualOrder residual = ResidualOrder::kPreNorm;
  MlpPlacement mlp = MlpPlacement::kSequential;
  kernels::Activation activation = kernels::Activation::kGeluTanh;
  bool gated = false;  // MLP hidden act(x G + g) * (x U + u) (LLaMA's SwiGLU); sequential only
  PositionEncoding position = PositionEncoding::kLearned;
  int64_t rotary_dim = 0;
  kernels::RotaryStyle rotary_style = kernels::RotaryStyle::kNone;
  float rotary_base = 10000.f;
  float rotary_mscale = 1.f;  // factor on cos and sin (yarn's attention factor)
  float attn_scale = 0.f;     // factor on q . k; 0: 1 / sqrt(head_dim) (T5 folds it into Q: 1)
  // An encoder-decoder's decoder block: a cross-attention sub-block over the encoder's memory
  // (AttentionInputs::cross) between the self-attention and the MLP.
  bool cross_attention = false;

  int64_t q_width() const { return heads * head_dim; }
  // One token's QKV product: all Q heads, then K, then V (K/V heads fewer with grouped-query).
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  bool pre_norm() const { return residual == ResidualOrder::kPreNorm; }
  bool parallel_mlp() const { return mlp != MlpPlacement::kSequential; }
  float score_scale() const;
  // Throws naming the field when the spec is inconsistent or asks for what the kernels lack.
  void check() const;
};

// How a Linear's weight is stored (docs/FORMAT.md). Dense: the model dtype, [in, out] (or
// [out, in] where the product says transposed). Weight-only quantized (16-bit models): kInt8,
// int8 [in, out] with one scale per output column; kInt4, uint8 [in / 2, out] (two input rows a
// byte) with a scale (and optionally a uint8 zero point) per `group` input rows and column.
enum class WeightFormat { kDense, kInt8, kInt4 };

// One weight of a product, out = in @ weight (+ bias), as device pointers (bias and scales of the
// model dtype).
struct Linear {
  const void* weight = nullptr;  // see WeightFormat
  const void* bias = nullptr;    // [out] or null
  const void* scales = nullptr;  // kInt8: [out]; kInt4: [in / group, out]; null for kDense
  const void* zeros = nullptr;   // kInt4 with zero points: uint8 [in / group, out]
  WeightFormat format = WeightFormat::kDense;
  int64_t in = 0, out = 0;
  int64_t group = 0;  // kInt4: input rows per scale

  bool quantized() const { return format != WeightFormat::kDense; }
};

// A norm's parameters: gamma (and beta for LayerNorm; null for RMSNorm or no bias).
struct NormWeights {
  const void* gamma = nullptr;
  const void* beta = nullptr;
};

}  // namespace layers
}  // namespace warpformer

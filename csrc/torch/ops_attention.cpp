// Torch ops for the attention kernel family (kernels/attention): argument checks, dtype dispatch,
// launch on PyTorch's current stream, schemas in
// registration.cpp. These are test and user entry points: besides dtype, shape and
// device they check the values of the index tensors (one device-to-host copy each), which the
// engine, calling the launchers directly, validates once per request instead.
#include "csrc/torch/ops_attention.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/torch/tensor_utils.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace ops {
namespace {

void check_head_dim(int64_t head_dim, const char* op) {
  TORCH_CHECK(
      head_dim <= INT32_MAX && kernels::attention_head_dim_supported(static_cast<int>(head_dim)),
      op, ": head_dim must be one of ", kernels::kAttentionHeadDimsText, ", got ", head_dim);
}

// k_cache / v_cache: dtype of `ref`, [slots, kv_heads, max_seq, head_dim], contiguous, same
// shape, kv_heads dividing the query heads (grouped-query attention; equal for multi-head).
void check_caches(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  c10::ScalarType dtype, const char* dtype_why, int64_t heads, int64_t head_dim) {
  check_dtype(k_cache, dtype, op, "k_cache", dtype_why);
  check_dtype(v_cache, dtype, op, "v_cache", dtype_why);
  check_dim(k_cache, 4, op, "k_cache");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), op, ": v_cache must have k_cache's shape ",
              k_cache.sizes(), " [slots, kv_heads, max_seq, head_dim], got ", v_cache.sizes());
  TORCH_CHECK(k_cache.size(1) > 0 && heads % k_cache.size(1) == 0, op,
              ": k_cache's heads (dim 1, the key/value heads) must divide the query heads (", heads,
              "), got shape ", k_cache.sizes());
  check_size(k_cache, 3, head_dim, op, "k_cache", "head_dim");
  TORCH_CHECK(k_cache.size(0) <= INT32_MAX && k_cache.size(2) <= INT32_MAX, op,
              ": k_cache slots and max_seq must be < 2^31, got shape ", k_cache.sizes());
  TORCH_CHECK(k_cache.is_contiguous(), op,
              ": k_cache must be contiguous [slots, heads, max_seq, head_dim], got strides ",
              k_cache.strides());
  TORCH_CHECK(v_cache.is_contiguous(), op,
              ": v_cache must be contiguous [slots, heads, max_seq, head_dim], got strides ",
              v_cache.strides());
}

// int32, 1-dimensional, `want` elements.
void check_index(const at::Tensor& t, int64_t want, const char* op, const char* arg,
                 const char* why) {
  check_dtype(t, at::kInt, op, arg);
  check_dim(t, 1, op, arg);
  check_size(t, 0, want, op, arg, why);
}

void check_window(int64_t window, const char* op) {
  TORCH_CHECK(window >= 0 && window <= INT32_MAX, op,
              ": window must be 0 (no window) or a positive number of positions below 2^31, got ",
              window);
}

void check_slopes(const OptTensor& slopes, int64_t heads, const char* op) {
  if (!slopes.has_value()) return;
  check_dtype(*slopes, at::kFloat, op, "alibi_slopes");
  check_dim(*slopes, 1, op, "alibi_slopes");
  check_size(*slopes, 0, heads, op, "alibi_slopes", "heads");
}

// T5's relative position bias: bias_max_distance M in [0, 65535] and, when given, a float32
// table [heads, 2 M + 1] (one value per clamped key - query distance -M .. M).
void check_position_bias(const OptTensor& table, int64_t max_distance, int64_t heads,
                         const char* op) {
  TORCH_CHECK(max_distance >= 0 && max_distance <= 65535, op,
              ": bias_max_distance must be in [0, 65535] (the largest key - query distance "
              "position_bias tells apart), got ",
              max_distance);
  if (!table.has_value()) return;
  check_dtype(*table, at::kFloat, op, "position_bias");
  check_dim(*table, 2, op, "position_bias");
  TORCH_CHECK(table->size(0) == heads && table->size(1) == 2 * max_distance + 1, op,
              ": position_bias must have shape [heads, 2 * bias_max_distance + 1] = [", heads, ", ",
              2 * max_distance + 1, "], got ", table->sizes());
  // The decode kernel indexes it in 32 bits.
  TORCH_CHECK(table->numel() <= INT32_MAX, op,
              ": position_bias must have fewer than 2^31 elements, got shape ", table->sizes());
}

void check_aligned(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", arg,
              " must start at a 16-byte aligned address (it is read with 16-byte vectors); "
              "pass a tensor that does not start at an odd offset into its storage");
}

// Host copy of an int32 index tensor (one synchronising copy).
std::vector<int32_t> host_values(const at::Tensor& t) {
  const at::Tensor h = t.to(at::kCPU).contiguous();
  std::vector<int32_t> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr<int32_t>(), v.size() * sizeof(int32_t));
  return v;
}

void check_values_in(const std::vector<int32_t>& v, int64_t lo, int64_t hi, const char* op,
                     const char* arg, const char* why) {
  for (size_t i = 0; i < v.size(); ++i) {
    TORCH_CHECK(v[i] >= lo && v[i] < hi, op, ": ", arg, "[", i, "] = ", v[i], " is outside [", lo,
                ", ", hi, ") (", why, ")");
  }
}

kernels::RotaryStyle parse_rotary_style(const std::string& s, const char* op) {
  if (s == "none") return kernels::RotaryStyle::kNone;
  if (s == "interleaved") return kernels::RotaryStyle::kInterleaved;
  if (s == "half") return kernels::RotaryStyle::kHalf;
  TORCH_CHECK(false, op, ": rotary_style must be one of 'none', 'interleaved' (GPT-J), ",
              "'half' (GPT-NeoX), got '", s, "'");
}

template <typename T>
const T* cptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// The head counts of a QKV tensor: [tokens, 3, heads, head_dim] (multi-head attention), or, where
// `kv_heads` > 0 is given (qkv_rotary_cache: the caches' head count), [tokens, heads + 2 kv_heads,
// head_dim] (grouped-query attention: Q heads, then K, then V).
struct QkvHeads {
  int64_t heads, kv_heads, head_dim;
  kernels::RotaryStyle style;
};

// qkv in either layout with an optional bias of its layout without tokens ([3, heads, head_dim]
// or [heads + 2 kv_heads, head_dim]) and dtype, and the rotary arguments (shared by
// qkv_rotary_cache and decode_attention_fused).
QkvHeads check_qkv(const char* op, const at::Tensor& qkv, const OptTensor& bias, int64_t rotary_dim,
                   const std::string& rotary_style, double rotary_base, int64_t kv_heads = 0) {
  check_floating(qkv, op, "qkv");
  const bool grouped = kv_heads > 0 && qkv.dim() == 3;
  if (!grouped) {
    check_dim(qkv, 4, op, "qkv");
    check_size(qkv, 1, 3, op, "qkv", "[tokens, 3, heads, head_dim]: q, k, v");
  }
  const int64_t tokens = qkv.size(0);
  const int64_t heads = grouped ? qkv.size(1) - 2 * kv_heads : qkv.size(2);
  const int64_t head_dim = qkv.size(grouped ? 2 : 3);
  TORCH_CHECK(tokens <= INT32_MAX, op, ": qkv has more than 2^31-1 tokens");
  TORCH_CHECK(heads > 0 && heads <= INT32_MAX, op, ": qkv must have at least one head, got shape ",
              qkv.sizes());
  TORCH_CHECK(!grouped || heads % kv_heads == 0, op, ": qkv [tokens, heads + 2 kv_heads, ",
              "head_dim] with kv_heads = ", kv_heads, " (k_cache's heads) leaves ", heads,
              " query heads, which kv_heads must divide; got shape ", qkv.sizes());
  check_head_dim(head_dim, op);
  if (bias.has_value()) {
    check_dtype(*bias, qkv.scalar_type(), op, "bias", "the dtype of qkv");
    const bool ok =
        grouped ? bias->dim() == 2 && bias->size(0) == qkv.size(1) && bias->size(1) == head_dim
                : bias->dim() == 3 && bias->size(0) == 3 && bias->size(1) == heads &&
                      bias->size(2) == head_dim;
    const std::vector<int64_t> want = grouped ? std::vector<int64_t>{qkv.size(1), head_dim}
                                              : std::vector<int64_t>{3, heads, head_dim};
    TORCH_CHECK(ok, op, ": bias must have shape ", at::IntArrayRef(want),
                " (qkv's shape without the tokens), got ", bias->sizes());
  }
  const kernels::RotaryStyle style = parse_rotary_style(rotary_style, op);
  TORCH_CHECK(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0, op,
              ": rotary_dim must be even and in [0, head_dim = ", head_dim, "], got ", rotary_dim);
  TORCH_CHECK(style != kernels::RotaryStyle::kNone || rotary_dim == 0, op,
              ": rotary_dim must be 0 when rotary_style is 'none', got ", rotary_dim);
  TORCH_CHECK(rotary_base > 0.0, op, ": rotary_base must be > 0, got ", rotary_base);
  return QkvHeads{heads, grouped ? kv_heads : heads, head_dim, style};
}

}  // namespace

at::Tensor qkv_rotary_cache(const at::Tensor& qkv, const OptTensor& bias, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& token_slot,
                            const at::Tensor& token_pos, int64_t rotary_dim,
                            const std::string& rotary_style, double rotary_base) {
  const char* op = "warpformer.qkv_rotary_cache";
  // A 3-dimensional qkv is grouped-query: its K/V head count is the caches'.
  check_dim(k_cache, 4, op, "k_cache");
  const QkvHeads qh = check_qkv(op, qkv, bias, rotary_dim, rotary_style, rotary_base,
                                qkv.dim() == 3 ? k_cache.size(1) : 0);
  const kernels::RotaryStyle style = qh.style;
  const int64_t tokens = qkv.size(0), heads = qh.heads, head_dim = qh.head_dim;
  check_caches(op, k_cache, v_cache, qkv.scalar_type(), "the dtype of qkv", heads, head_dim);
  TORCH_CHECK(qkv.dim() == 3 || k_cache.size(1) == heads, op,
              ": a [tokens, 3, heads, head_dim] qkv writes caches of its heads (", heads,
              "), got k_cache shape ", k_cache.sizes(),
              "; grouped-query attention passes qkv as [tokens, heads + 2 kv_heads, head_dim]");
  check_index(token_slot, tokens, op, "token_slot", "tokens of qkv");
  check_index(token_pos, tokens, op, "token_pos", "tokens of qkv");
  check_cuda(qkv, op, "qkv");
  if (bias.has_value()) check_cuda(*bias, op, "bias", qkv, "qkv");
  check_cuda(k_cache, op, "k_cache", qkv, "qkv");
  check_cuda(v_cache, op, "v_cache", qkv, "qkv");
  check_cuda(token_slot, op, "token_slot", qkv, "qkv");
  check_cuda(token_pos, op, "token_pos", qkv, "qkv");

  const c10::cuda::CUDAGuard guard(qkv.device());
  check_values_in(host_values(token_slot), 0, k_cache.size(0), op, "token_slot",
                  "the slots of k_cache");
  check_values_in(host_values(token_pos), 0, k_cache.size(2), op, "token_pos",
                  "the positions max_seq of k_cache");
  const at::Tensor x = qkv.contiguous();
  const OptTensor b = bias.has_value() ? OptTensor(bias->contiguous()) : OptTensor();
  const at::Tensor slot = token_slot.contiguous();
  const at::Tensor pos = token_pos.contiguous();
  at::Tensor q = at::empty({tokens, heads, head_dim}, x.options());
  if (tokens == 0) return q;
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "qkv"), op, [&] {
    kernels::QkvPrepParams<scalar_t> p{};
    p.q_out = mptr<scalar_t>(q);
    p.k_cache = mptr<scalar_t>(k_cache);
    p.v_cache = mptr<scalar_t>(v_cache);
    p.qkv = cptr<scalar_t>(x);
    p.bias = ptr_or_null<const scalar_t>(b);
    p.token_slot = slot.data_ptr<int32_t>();
    p.token_pos = pos.data_ptr<int32_t>();
    p.tokens = static_cast<int>(tokens);
    p.heads = static_cast<int>(heads);
    p.head_dim = static_cast<int>(head_dim);
    p.num_slots = static_cast<int>(k_cache.size(0));
    p.max_seq = static_cast<int>(k_cache.size(2));
    p.rotary_dim = static_cast<int>(rotary_dim);
    p.rotary_style = style;
    p.rotary_base = static_cast<float>(rotary_base);
    p.kv_heads = static_cast<int>(qh.kv_heads);
    WF_CUDA_CHECK(kernels::launch_qkv_prep(p, current_stream(x)));
  });
  return q;
}

void kv_cache_write(const at::Tensor& kv, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& token_slot, const at::Tensor& token_pos,
                    const OptTensor& bias) {
  const char* op = "warpformer.kv_cache_write";
  check_floating(kv, op, "kv");
  check_dim_in(kv, {3, 4}, op, "kv");
  check_dim(k_cache, 4, op, "k_cache");
  // The caches' head count is the K/V heads of kv: [tokens, 2, kv_heads, head_dim] or, packed as
  // the kernel reads it, [tokens, 2 kv_heads, head_dim] (K heads, then V heads).
  const int64_t kv_heads = k_cache.size(1);
  TORCH_CHECK(kv_heads > 0 && kv_heads <= INT32_MAX, op,
              ": k_cache must have at least one head (dim 1), got shape ", k_cache.sizes());
  if (kv.dim() == 4) {
    check_size(kv, 1, 2, op, "kv", "[tokens, 2, kv_heads, head_dim]: k, v");
    check_size(kv, 2, kv_heads, op, "kv", "the heads of k_cache");
  } else {
    check_size(kv, 1, 2 * kv_heads, op, "kv",
               "[tokens, 2 kv_heads, head_dim] with kv_heads the heads of k_cache");
  }
  const int64_t tokens = kv.size(0), head_dim = kv.size(kv.dim() - 1);
  TORCH_CHECK(tokens <= INT32_MAX, op, ": kv has more than 2^31-1 tokens");
  check_head_dim(head_dim, op);
  check_caches(op, k_cache, v_cache, kv.scalar_type(), "the dtype of kv", kv_heads, head_dim);
  if (bias.has_value()) {
    check_dtype(*bias, kv.scalar_type(), op, "bias", "the dtype of kv");
    const at::IntArrayRef want = kv.sizes().slice(1);
    TORCH_CHECK(bias->sizes() == want, op, ": bias must have shape ", want,
                " (kv's shape without the tokens), got ", bias->sizes());
  }
  check_index(token_slot, tokens, op, "token_slot", "tokens of kv");
  check_index(token_pos, tokens, op, "token_pos", "tokens of kv");
  check_cuda(kv, op, "kv");
  if (bias.has_value()) check_cuda(*bias, op, "bias", kv, "kv");
  check_cuda(k_cache, op, "k_cache", kv, "kv");
  check_cuda(v_cache, op, "v_cache", kv, "kv");
  check_cuda(token_slot, op, "token_slot", kv, "kv");
  check_cuda(token_pos, op, "token_pos", kv, "kv");

  const c10::cuda::CUDAGuard guard(kv.device());
  check_values_in(host_values(token_slot), 0, k_cache.size(0), op, "token_slot",
                  "the slots of k_cache");
  check_values_in(host_values(token_pos), 0, k_cache.size(2), op, "token_pos",
                  "the positions max_seq of k_cache");
  if (tokens == 0) return;
  const at::Tensor x = kv.contiguous();
  const OptTensor b = bias.has_value() ? OptTensor(bias->contiguous()) : OptTensor();
  const at::Tensor slot = token_slot.contiguous();
  const at::Tensor pos = token_pos.contiguous();
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "kv"), op, [&] {
    kernels::QkvPrepParams<scalar_t> p{};
    p.kv_only = true;  // no q_out, no rotary
    p.k_cache = mptr<scalar_t>(k_cache);
    p.v_cache = mptr<scalar_t>(v_cache);
    p.qkv = cptr<scalar_t>(x);
    p.bias = ptr_or_null<const scalar_t>(b);
    p.token_slot = slot.data_ptr<int32_t>();
    p.token_pos = pos.data_ptr<int32_t>();
    p.tokens = static_cast<int>(tokens);
    p.heads = static_cast<int>(kv_heads);
    p.kv_heads = static_cast<int>(kv_heads);
    p.head_dim = static_cast<int>(head_dim);
    p.num_slots = static_cast<int>(k_cache.size(0));
    p.max_seq = static_cast<int>(k_cache.size(2));
    WF_CUDA_CHECK(kernels::launch_qkv_prep(p, current_stream(x)));
  });
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& cu_seqlens,
                             const at::Tensor& seq_slot, const OptTensor& alibi_slopes,
                             double scale, int64_t max_seqlen, int64_t window,
                             const OptTensor& seq_past, const OptTensor& position_bias,
                             int64_t bias_max_distance, bool causal) {
  const char* op = "warpformer.context_attention";
  check_window(window, op);
  TORCH_CHECK(causal || window == 0, op,
              ": window must be 0 when causal is False (every query sees its whole sequence), "
              "got ",
              window);
  check_floating(q, op, "q");
  check_dim(q, 3, op, "q");
  const int64_t tokens = q.size(0), heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK(tokens <= INT32_MAX, op, ": q has more than 2^31-1 tokens");
  TORCH_CHECK(heads > 0 && heads <= 65535, op, ": q must have 1 to 65535 heads, got shape ",
              q.sizes());
  check_head_dim(head_dim, op);
  check_caches(op, k_cache, v_cache, q.scalar_type(), "the dtype of q", heads, head_dim);
  check_dtype(cu_seqlens, at::kInt, op, "cu_seqlens");
  check_dim(cu_seqlens, 1, op, "cu_seqlens");
  TORCH_CHECK(cu_seqlens.size(0) >= 1 && cu_seqlens.size(0) <= 65536, op,
              ": cu_seqlens must have batch + 1 elements with batch <= 65535, got shape ",
              cu_seqlens.sizes());
  const int64_t batch = cu_seqlens.size(0) - 1;
  check_index(seq_slot, batch, op, "seq_slot", "batch = cu_seqlens.shape[0] - 1");
  if (seq_past.has_value()) {
    check_index(*seq_past, batch, op, "seq_past", "batch = cu_seqlens.shape[0] - 1");
  }
  check_slopes(alibi_slopes, heads, op);
  check_position_bias(position_bias, bias_max_distance, heads, op);
  TORCH_CHECK(max_seqlen >= 0 && max_seqlen <= INT32_MAX, op,
              ": max_seqlen must be in [0, 2^31), got ", max_seqlen);
  check_cuda(q, op, "q");
  check_cuda(k_cache, op, "k_cache", q, "q");
  check_cuda(v_cache, op, "v_cache", q, "q");
  check_cuda(cu_seqlens, op, "cu_seqlens", q, "q");
  check_cuda(seq_slot, op, "seq_slot", q, "q");
  if (alibi_slopes.has_value()) check_cuda(*alibi_slopes, op, "alibi_slopes", q, "q");
  if (seq_past.has_value()) check_cuda(*seq_past, op, "seq_past", cu_seqlens, "cu_seqlens");
  if (position_bias.has_value()) check_cuda(*position_bias, op, "position_bias", q, "q");

  const c10::cuda::CUDAGuard guard(q.device());
  const std::vector<int32_t> cu = host_values(cu_seqlens);
  // Positions already cached per sequence (none without seq_past): the new rows follow them.
  const std::vector<int32_t> past = seq_past.has_value()
                                        ? host_values(*seq_past)
                                        : std::vector<int32_t>(static_cast<size_t>(batch), 0);
  TORCH_CHECK(cu[0] == 0, op, ": cu_seqlens[0] must be 0, got ", cu[0]);
  TORCH_CHECK(cu[batch] == tokens, op, ": cu_seqlens[-1] must equal the number of tokens of q (",
              tokens, "), got ", cu[batch]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = static_cast<int64_t>(cu[b + 1]) - cu[b];
    TORCH_CHECK(len >= 0, op, ": cu_seqlens must be non-decreasing, got cu_seqlens[", b,
                "] = ", cu[b], " > cu_seqlens[", b + 1, "] = ", cu[b + 1]);
    TORCH_CHECK(len <= k_cache.size(2), op, ": sequence ", b, " has ", len,
                " tokens, more than the cache's max_seq = ", k_cache.size(2));
    TORCH_CHECK(len <= max_seqlen, op, ": sequence ", b, " has ", len,
                " tokens, more than max_seqlen = ", max_seqlen);
    TORCH_CHECK(past[b] >= 0, op, ": seq_past[", b, "] = ", past[b],
                " is negative (it counts the positions already cached)");
    TORCH_CHECK(past[b] + len <= k_cache.size(2), op, ": sequence ", b, " has seq_past[", b,
                "] = ", past[b], " cached + ", len,
                " new positions, more than the cache's max_seq = ", k_cache.size(2));
  }
  check_values_in(host_values(seq_slot), 0, k_cache.size(0), op, "seq_slot",
                  "the slots of k_cache");
  const at::Tensor x = q.contiguous();
  check_aligned(x, op, "q");
  check_aligned(k_cache, op, "k_cache");
  check_aligned(v_cache, op, "v_cache");
  const at::Tensor cu_d = cu_seqlens.contiguous();
  const at::Tensor slot_d = seq_slot.contiguous();
  const OptTensor past_d = seq_past.has_value() ? OptTensor(seq_past->contiguous()) : OptTensor();
  const OptTensor slopes =
      alibi_slopes.has_value() ? OptTensor(alibi_slopes->contiguous()) : OptTensor();
  const OptTensor rel =
      position_bias.has_value() ? OptTensor(position_bias->contiguous()) : OptTensor();
  at::Tensor out = at::empty_like(x);
  if (tokens == 0 || batch == 0) return out;
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, "q"), op, [&] {
    kernels::ContextAttentionParams<scalar_t> p{};
    p.out = mptr<scalar_t>(out);
    p.q = cptr<scalar_t>(x);
    p.k_cache = cptr<scalar_t>(k_cache);
    p.v_cache = cptr<scalar_t>(v_cache);
    p.cu_seqlens = cu_d.data_ptr<int32_t>();
    p.seq_slot = slot_d.data_ptr<int32_t>();
    p.alibi_slopes = slopes.has_value() ? slopes->data_ptr<float>() : nullptr;
    p.batch = static_cast<int>(batch);
    p.heads = static_cast<int>(heads);
    p.head_dim = static_cast<int>(head_dim);
    p.num_slots = static_cast<int>(k_cache.size(0));
    p.max_seq = static_cast<int>(k_cache.size(2));
    p.max_seqlen = static_cast<int>(max_seqlen);
    p.scale = static_cast<float>(scale);
    p.kv_heads = static_cast<int>(k_cache.size(1));
    p.window = static_cast<int>(window);
    p.seq_past = past_d.has_value() ? past_d->data_ptr<int32_t>() : nullptr;
    p.causal = causal;
    p.position_bias = rel.has_value() ? rel->data_ptr<float>() : nullptr;
    p.bias_max_distance = static_cast<int>(bias_max_distance);
    WF_CUDA_CHECK(kernels::launch_context_attention(p, current_stream(x)));
  });
  return out;
}

namespace {

// The fused decode attention's QKV preparation (checked by the caller).
struct FusedPrep {
  at::Tensor qkv;  // contiguous [rows, 3, heads, head_dim] or [rows, heads + 2 kv_heads, head_dim]
  OptTensor bias;  // contiguous, qkv's shape without the rows
  int rotary_dim;
  kernels::RotaryStyle style;
  float rotary_base;
};

// Fills the fields both launchers share.
template <typename T>
void fill_decode(kernels::DecodeAttentionParams<T>& p, at::Tensor& out, const at::Tensor& k_cache,
                 const at::Tensor& v_cache, const OptTensor& slot_d, const at::Tensor& len_d,
                 const OptTensor& ind_d, const OptTensor& slopes, const OptTensor& rel,
                 int64_t bias_max_distance, at::Tensor& workspace, size_t ws_bytes, int64_t rows,
                 int64_t heads, int64_t head_dim, double scale, int64_t window) {
  p.out = mptr<T>(out);
  p.k_cache = cptr<T>(k_cache);
  p.v_cache = cptr<T>(v_cache);
  p.row_slot = slot_d.has_value() ? slot_d->data_ptr<int32_t>() : nullptr;
  p.lengths = len_d.data_ptr<int32_t>();
  p.cache_indir = ind_d.has_value() ? ind_d->data_ptr<int32_t>() : nullptr;
  p.alibi_slopes = slopes.has_value() ? slopes->data_ptr<float>() : nullptr;
  p.workspace = ws_bytes > 0 ? workspace.data_ptr<float>() : nullptr;
  p.workspace_bytes = ws_bytes;
  p.rows = static_cast<int>(rows);
  p.heads = static_cast<int>(heads);
  p.head_dim = static_cast<int>(head_dim);
  p.num_slots = static_cast<int>(k_cache.size(0));
  p.max_seq = static_cast<int>(k_cache.size(2));
  p.scale = static_cast<float>(scale);
  p.kv_heads = static_cast<int>(k_cache.size(1));
  p.window = static_cast<int>(window);
  p.position_bias = rel.has_value() ? rel->data_ptr<float>() : nullptr;
  p.bias_max_distance = static_cast<int>(bias_max_distance);
}

// decode_attention and decode_attention_fused after their query checks: `x` is q, or qkv when
// `prep` is given (named `x_name` in messages).
at::Tensor run_decode_attention(const char* op, const at::Tensor& x, const char* x_name,
                                int64_t rows, int64_t heads, int64_t head_dim,
                                const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const OptTensor& row_slot, const at::Tensor& lengths,
                                const OptTensor& cache_indir, const OptTensor& alibi_slopes,
                                double scale, int64_t window, const OptTensor& position_bias,
                                int64_t bias_max_distance, const FusedPrep* prep) {
  check_window(window, op);
  const std::string dtype_why = std::string("the dtype of ") + x_name;
  const std::string rows_why = std::string("rows of ") + x_name;
  check_caches(op, k_cache, v_cache, x.scalar_type(), dtype_why.c_str(), heads, head_dim);
  const int64_t slots = k_cache.size(0), max_seq = k_cache.size(2);
  if (row_slot.has_value()) check_index(*row_slot, rows, op, "row_slot", rows_why.c_str());
  check_index(lengths, rows, op, "lengths", rows_why.c_str());
  if (cache_indir.has_value()) {
    check_dtype(*cache_indir, at::kInt, op, "cache_indir");
    TORCH_CHECK(
        cache_indir->dim() == 2 && cache_indir->size(0) == rows && cache_indir->size(1) == max_seq,
        op, ": cache_indir must have shape [rows, max_seq] = [", rows, ", ", max_seq, "], got ",
        cache_indir->sizes());
  }
  check_slopes(alibi_slopes, heads, op);
  check_position_bias(position_bias, bias_max_distance, heads, op);
  check_cuda(x, op, x_name);
  check_cuda(k_cache, op, "k_cache", x, x_name);
  check_cuda(v_cache, op, "v_cache", x, x_name);
  if (row_slot.has_value()) check_cuda(*row_slot, op, "row_slot", x, x_name);
  check_cuda(lengths, op, "lengths", x, x_name);
  if (cache_indir.has_value()) check_cuda(*cache_indir, op, "cache_indir", x, x_name);
  if (alibi_slopes.has_value()) check_cuda(*alibi_slopes, op, "alibi_slopes", x, x_name);
  if (position_bias.has_value()) check_cuda(*position_bias, op, "position_bias", x, x_name);
  if (prep != nullptr && prep->bias.has_value()) check_cuda(*prep->bias, op, "bias", x, x_name);

  const c10::cuda::CUDAGuard guard(x.device());
  // Contiguous copies first: the host checks below read the values back, which waits for them,
  // so no copy kernel runs just ahead of the attention (the fused kernel reads the lengths,
  // slots and indirection before its programmatic wait for the kernel ahead: attention.h).
  const OptTensor slot_d = row_slot.has_value() ? OptTensor(row_slot->contiguous()) : OptTensor();
  const at::Tensor len_d = lengths.contiguous();
  const OptTensor ind_d =
      cache_indir.has_value() ? OptTensor(cache_indir->contiguous()) : OptTensor();
  const std::vector<int32_t> lens = host_values(len_d);
  check_values_in(lens, 1, max_seq + 1, op, "lengths", "1 .. max_seq of k_cache");
  std::vector<int32_t> slot_of(static_cast<size_t>(rows));
  if (row_slot.has_value()) {
    slot_of = host_values(*slot_d);
    check_values_in(slot_of, 0, slots, op, "row_slot", "the slots of k_cache");
  } else {
    TORCH_CHECK(rows <= slots, op, ": row_slot is None, so row r reads slot r, but ", x_name,
                " has ", rows, " rows and k_cache only ", slots, " slots");
    for (int64_t r = 0; r < rows; ++r) slot_of[r] = static_cast<int32_t>(r);
  }
  // The fused kernel writes each row's new token at (its slot, lengths - 1) while the other rows
  // attend: a position written by one row must not be read by another, or the result would
  // depend on block timing. Rows therefore need distinct slots (writer_of maps slot -> row).
  std::vector<int64_t> writer_of;
  if (prep != nullptr) {
    writer_of.assign(static_cast<size_t>(slots), -1);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t& w = writer_of[slot_of[r]];
      TORCH_CHECK(w < 0, op, ": rows ", w, " and ", r, " both write their new token into slot ",
                  slot_of[r], "; every row needs its own slot (row_slot must be distinct)");
      w = r;
    }
  }
  if (cache_indir.has_value()) {
    const std::vector<int32_t> ind = host_values(*ind_d);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t pos = 0; pos < lens[r]; ++pos) {
        const int32_t s = ind[r * max_seq + pos];
        TORCH_CHECK(s >= 0 && s < slots, op, ": cache_indir[", r, ", ", pos, "] = ", s,
                    " is outside the slots [0, ", slots, ") of k_cache");
      }
      if (prep == nullptr) continue;
      // The fused kernel writes the new token into the row's own slot and reads it back there.
      TORCH_CHECK(ind[r * max_seq + lens[r] - 1] == slot_of[r], op, ": cache_indir[", r,
                  ", lengths[", r, "] - 1] must be the row's own slot ", slot_of[r],
                  " (the new token is written there), got ", ind[r * max_seq + lens[r] - 1]);
      for (int64_t pos = 0; pos + 1 < lens[r]; ++pos) {
        const int32_t s = ind[r * max_seq + pos];
        const int64_t w = writer_of[s];
        TORCH_CHECK(w < 0 || w == r || lens[w] - 1 != pos, op, ": cache_indir[", r, ", ", pos,
                    "] = ", s, " reads the position row ", w,
                    " writes its new token into in "
                    "the same call (slot ",
                    s, ", position ", pos, ")");
      }
    }
  }
  if (prep == nullptr) check_aligned(x, op, x_name);
  check_aligned(k_cache, op, "k_cache");
  check_aligned(v_cache, op, "v_cache");
  const OptTensor slopes =
      alibi_slopes.has_value() ? OptTensor(alibi_slopes->contiguous()) : OptTensor();
  const OptTensor rel =
      position_bias.has_value() ? OptTensor(position_bias->contiguous()) : OptTensor();
  at::Tensor out = at::empty({rows, heads, head_dim}, x.options());
  if (rows == 0) return out;
  const size_t ws_bytes = kernels::decode_attention_workspace_bytes(
      static_cast<int>(rows), static_cast<int>(heads), static_cast<int>(head_dim),
      static_cast<int>(max_seq));
  at::Tensor workspace;
  if (ws_bytes > 0) {
    workspace =
        at::empty({static_cast<int64_t>((ws_bytes + 3) / 4)}, x.options().dtype(at::kFloat));
  }
  at::Tensor inv_freq;
  if (prep != nullptr && prep->style != kernels::RotaryStyle::kNone && prep->rotary_dim > 0) {
    inv_freq = at::empty({prep->rotary_dim / 2}, x.options().dtype(at::kFloat));
    WF_CUDA_CHECK(kernels::launch_rotary_inv_freq(inv_freq.data_ptr<float>(), prep->rotary_dim,
                                                  prep->rotary_base, current_stream(x)));
  }
  WF_DISPATCH_FLOATING(to_dtype(x.scalar_type(), op, x_name), op, [&] {
    if (prep == nullptr) {
      kernels::DecodeAttentionParams<scalar_t> p{};
      fill_decode(p, out, k_cache, v_cache, slot_d, len_d, ind_d, slopes, rel, bias_max_distance,
                  workspace, ws_bytes, rows, heads, head_dim, scale, window);
      p.q = cptr<scalar_t>(x);
      WF_CUDA_CHECK(kernels::launch_decode_attention(p, current_stream(x)));
      return;
    }
    kernels::DecodeAttentionFusedParams<scalar_t> p{};
    fill_decode<scalar_t>(p, out, k_cache, v_cache, slot_d, len_d, ind_d, slopes, rel,
                          bias_max_distance, workspace, ws_bytes, rows, heads, head_dim, scale,
                          window);
    p.qkv = cptr<scalar_t>(prep->qkv);
    p.qkv_bias = ptr_or_null<const scalar_t>(prep->bias);
    p.rotary_dim = prep->rotary_dim;
    p.rotary_style = prep->style;
    p.rotary_inv_freq = inv_freq.defined() ? inv_freq.data_ptr<float>() : nullptr;
    WF_CUDA_CHECK(kernels::launch_decode_attention_fused(p, current_stream(x)));
  });
  return out;
}

}  // namespace

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const OptTensor& row_slot,
                            const at::Tensor& lengths, const OptTensor& cache_indir,
                            const OptTensor& alibi_slopes, double scale, int64_t window,
                            const OptTensor& position_bias, int64_t bias_max_distance) {
  const char* op = "warpformer.decode_attention";
  check_floating(q, op, "q");
  check_dim(q, 3, op, "q");
  const int64_t rows = q.size(0), heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK(rows <= 65535, op, ": q must have at most 65535 rows, got shape ", q.sizes());
  TORCH_CHECK(heads > 0 && heads <= INT32_MAX, op, ": q must have at least one head, got shape ",
              q.sizes());
  check_head_dim(head_dim, op);
  return run_decode_attention(op, q.contiguous(), "q", rows, heads, head_dim, k_cache, v_cache,
                              row_slot, lengths, cache_indir, alibi_slopes, scale, window,
                              position_bias, bias_max_distance, nullptr);
}

at::Tensor decode_attention_fused(const at::Tensor& qkv, const OptTensor& bias, at::Tensor& k_cache,
                                  at::Tensor& v_cache, const OptTensor& row_slot,
                                  const at::Tensor& lengths, const OptTensor& cache_indir,
                                  const OptTensor& alibi_slopes, double scale, int64_t rotary_dim,
                                  const std::string& rotary_style, double rotary_base,
                                  int64_t window, const OptTensor& position_bias,
                                  int64_t bias_max_distance) {
  const char* op = "warpformer.decode_attention_fused";
  check_dim(k_cache, 4, op, "k_cache");
  // Multi-head attention passes qkv [rows, 3, heads, head_dim]; grouped-query attention
  // [rows, heads + 2 kv_heads, head_dim] with kv_heads = k_cache's heads.
  const QkvHeads qh = check_qkv(op, qkv, bias, rotary_dim, rotary_style, rotary_base,
                                qkv.dim() == 3 ? k_cache.size(1) : 0);
  const kernels::RotaryStyle style = qh.style;
  const int64_t rows = qkv.size(0), heads = qh.heads, head_dim = qh.head_dim;
  TORCH_CHECK(qkv.dim() == 3 || k_cache.size(1) == heads, op,
              ": a [rows, 3, heads, head_dim] qkv writes caches of its heads (", heads,
              "), got k_cache shape ", k_cache.sizes(),
              "; grouped-query attention passes qkv as [rows, heads + 2 kv_heads, head_dim]");
  TORCH_CHECK(rows <= 65535, op, ": qkv must have at most 65535 rows, got shape ", qkv.sizes());
  FusedPrep prep{qkv.contiguous(), bias.has_value() ? OptTensor(bias->contiguous()) : OptTensor(),
                 static_cast<int>(rotary_dim), style, static_cast<float>(rotary_base)};
  return run_decode_attention(op, prep.qkv, "qkv", rows, heads, head_dim, k_cache, v_cache,
                              row_slot, lengths, cache_indir, alibi_slopes, scale, window,
                              position_bias, bias_max_distance, &prep);
}

at::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1 && num_heads <= 65535,
              "warpformer.alibi_slopes: num_heads must be "
              "in [1, 65535], got ",
              num_heads);
  const std::vector<float> s = kernels::alibi_slopes(static_cast<int>(num_heads));
  at::Tensor out = at::empty({num_heads}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(out.data_ptr<float>(), s.data(), s.size() * sizeof(float));
  return out;
}

}  // namespace ops
}  // namespace warpformer

// QKV preparation for both phases (see attention.h): bias add, rotary embedding of q and k,
// q written packed, k and v written into the KV cache at (token_slot, token_pos). kv_only (a
// cross-attention's memory) is the same kernel with no query heads: no q, no rotary.
//
// One block per token. The block first computes cos/sin of the token's position for the
// rotary_dim/2 frequencies into shared memory; then each thread handles 16-byte vectors of q and k
// (both elements of a rotation pair are read and written by the same thread), and finally v is
// copied with 16-byte vectors. Unaligned tensors, or a half-split rotation whose halves are not
// whole vectors apart, take the element-by-element path (same arithmetic, same bits). The kernel is
// memory-bound, and element by element it moved the QKV product well below the copy bandwidth at
// prompt sizes, hence the 16-byte vectors (benchmarks/HISTORY.md, "Batch-64 prefill: where the
// other 45% goes" and "Figures moved from code comments (issue 50)").
#include "kernels/attention/attention_common.cuh"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kPrepThreads = 256;
constexpr int kMaxHalfRotary = 128;  // rotary_dim <= head_dim <= 256

template <typename T, int VEC>
__global__ void __launch_bounds__(kPrepThreads) qkv_prep_kernel(const QkvPrepParams<T> p) {
  wait_for_prior_kernels();
  __shared__ float cos_s[kMaxHalfRotary];
  __shared__ float sin_s[kMaxHalfRotary];
  const int t = blockIdx.x;
  const int hd = p.head_dim;
  // kv_only: no query heads, so every q loop below is empty and the K heads start the row.
  const int heads = p.kv_only ? 0 : p.heads;
  const int kvh = p.kv_heads > 0 ? p.kv_heads : heads;
  const int rot_half = p.rotary_style == RotaryStyle::kNone ? 0 : p.rotary_dim / 2;
  const int pos = p.token_pos[t];
  const int slot = p.token_slot[t];
  const bool write_cache = slot >= 0 && slot < p.num_slots && pos >= 0 && pos < p.max_seq;

  attn::rotary_table(pos, rot_half, p.rotary_dim, p.rotary_base, cos_s, sin_s, p.rotary_inv_freq,
                     p.rotary_mscale);
  __syncthreads();

  const int64_t row = static_cast<int64_t>(heads) * hd;   // elements of q per token
  const int64_t kv_row = static_cast<int64_t>(kvh) * hd;  // of k, and of v
  const T* __restrict__ qkv_t = p.qkv + static_cast<int64_t>(t) * (row + 2 * kv_row);
  T* __restrict__ q_out_t = p.q_out + static_cast<int64_t>(t) * row;
  const int64_t cache_head_stride = static_cast<int64_t>(p.max_seq) * hd;
  const int64_t cache_base =
      write_cache ? (static_cast<int64_t>(slot) * kvh * p.max_seq + pos) * hd : 0;
  const bool interleaved = p.rotary_style == RotaryStyle::kInterleaved;
  if constexpr (VEC == 1) {
    // q and k, element by element: pairs. Pair j < rot_half is a rotary pair; the others are
    // (rd + 2k, rd + 2k + 1), copied unchanged.
    const int half = hd / 2;
    for (int idx = threadIdx.x; idx < max(heads, kvh) * half; idx += blockDim.x) {
      const int h = idx / half;
      const int j = idx - h * half;
      int a, b;
      const bool rot = attn::rotary_pair(j, rot_half, interleaved, a, b);
      const float c = rot ? cos_s[j] : 0.f, s = rot ? sin_s[j] : 0.f;
      const int64_t off = static_cast<int64_t>(h) * hd;
      // q
      if (h < heads) {
        const float x = attn::load_biased(qkv_t, p.bias, off + a, static_cast<int>(off) + a);
        const float y = attn::load_biased(qkv_t, p.bias, off + b, static_cast<int>(off) + b);
        float ox = x, oy = y;
        if (rot) attn::rotate(x, y, c, s, ox, oy);
        q_out_t[off + a] = from_float<T>(ox);
        q_out_t[off + b] = from_float<T>(oy);
      }
      // k
      if (write_cache && h < kvh) {
        const float x = attn::load_biased(qkv_t + row, p.bias ? p.bias + row : nullptr, off + a,
                                          static_cast<int>(off) + a);
        const float y = attn::load_biased(qkv_t + row, p.bias ? p.bias + row : nullptr, off + b,
                                          static_cast<int>(off) + b);
        T* __restrict__ kc = p.k_cache + cache_base + h * cache_head_stride;
        float ox = x, oy = y;
        if (rot) attn::rotate(x, y, c, s, ox, oy);
        kc[a] = from_float<T>(ox);
        kc[b] = from_float<T>(oy);
      }
    }
  } else {
    // q and k in VEC-element vectors (the launcher's conditions: 16-byte aligned rows, and for
    // the half-split style rot_half a multiple of VEC). Element for element the same arithmetic
    // as above, so both paths write the same bits. Interleaved pairs never straddle a vector (VEC
    // and d are even); a half-split vector below rot_half is rotated with its partner rot_half
    // further on, which the partner's own unit then skips.
    const int vec_per_head = hd / VEC;
    const int units = heads * vec_per_head;  // of q, then kv_units of k
    const int kv_units = kvh * vec_per_head;
    const int rot_dim = 2 * rot_half;
    for (int idx = threadIdx.x; idx < units + kv_units; idx += blockDim.x) {
      const bool is_k = idx >= units;
      if (is_k && !write_cache) break;  // idx only grows: the rest are k units too
      const int u = is_k ? idx - units : idx;
      const int h = u / vec_per_head;
      const int d = (u - h * vec_per_head) * VEC;
      if (!interleaved && d >= rot_half && d < rot_dim) continue;
      const int64_t src_off = (is_k ? row : 0) + static_cast<int64_t>(h) * hd + d;
      T* __restrict__ dst = is_k ? p.k_cache + cache_base + h * cache_head_stride + d
                                 : q_out_t + static_cast<int64_t>(h) * hd + d;
      float x[VEC];
      attn::load_biased_vec<T, VEC>(qkv_t, p.bias, src_off, x);
      if (d < rot_dim && interleaved) {
#pragma unroll
        for (int e = 0; e < VEC; e += 2) {
          const int j = (d + e) / 2;
          if (j < rot_half) attn::rotate(x[e], x[e + 1], cos_s[j], sin_s[j], x[e], x[e + 1]);
        }
      } else if (d < rot_dim) {
        float y[VEC];
        attn::load_biased_vec<T, VEC>(qkv_t, p.bias, src_off + rot_half, y);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          attn::rotate(x[e], y[e], cos_s[d + e], sin_s[d + e], x[e], y[e]);
        }
        store_vec<T, VEC>(dst + rot_half, y);
      }
      store_vec<T, VEC>(dst, x);
    }
  }

  // v: plain copy (+ bias) with VEC-element vectors; head_dim % VEC == 0 by construction.
  if (write_cache) {
    const int vec_per_head = hd / VEC;
    for (int idx = threadIdx.x; idx < kvh * vec_per_head; idx += blockDim.x) {
      const int h = idx / vec_per_head;
      const int d = (idx - h * vec_per_head) * VEC;
      float v[VEC];
      attn::load_biased_vec<T, VEC>(qkv_t, p.bias, row + kv_row + static_cast<int64_t>(h) * hd + d,
                                    v);
      store_vec<T, VEC>(p.v_cache + cache_base + h * cache_head_stride + d, v);
    }
  }
}

__global__ void rotary_inv_freq_kernel(float* out, int rotary_dim, float rotary_base) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rotary_dim / 2) out[i] = attn::rotary_inv_freq(i, rotary_dim, rotary_base);
}

// transformers' linear, llama3 and yarn rope parameters on one frequency (see RotaryScaling),
// every operation rounded as its fp32 tensor arithmetic rounds (no contraction).
__global__ void rotary_scale_kernel(float* inv_freq, int half, RotaryScaling r, int rotary_dim) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= half) return;
  const float f = inv_freq[i];
  const float factor = r.factor;
  if (r.kind == RotaryScaling::kLinear) {
    inv_freq[i] = __fdiv_rn(f, factor);
    return;
  }
  if (r.kind == RotaryScaling::kYarn) {
    // pos_freq = base^(2i/dim) as HF's fp32 power; a ramp over the pairs between the correction
    // dims blends the interpolated (1 / (factor pos_freq)) and extrapolated (1 / pos_freq) ones.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float pos_freq =
        static_cast<float>(pow(static_cast<double>(r.base), static_cast<double>(expo)));
    const float ramp = fminf(
        fmaxf(__fdiv_rn(__fsub_rn(static_cast<float>(i), r.ramp_low), r.ramp_span), 0.f), 1.f);
    const float extrapolate = __fsub_rn(1.f, ramp);
    const float interp = __fdiv_rn(1.f, __fmul_rn(factor, pos_freq));
    const float extrap = __fdiv_rn(1.f, pos_freq);
    inv_freq[i] =
        __fadd_rn(__fmul_rn(interp, __fsub_rn(1.f, extrapolate)), __fmul_rn(extrap, extrapolate));
    return;
  }
  const float low = r.low_freq_factor, high = r.high_freq_factor,
              original = r.original_max_position;
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  // A scalar over a tensor is the tensor's reciprocal times the scalar in PyTorch (two
  // roundings), so wavelen and original / wavelen are formed that way.
  const float wavelen = __fmul_rn(__frcp_rn(f), two_pi);
  const float low_wavelen = __fdiv_rn(original, low), high_wavelen = __fdiv_rn(original, high);
  const float scaled = wavelen > low_wavelen ? __fdiv_rn(f, factor) : f;
  const float smooth =
      __fdiv_rn(__fsub_rn(__fmul_rn(__frcp_rn(wavelen), original), low), __fsub_rn(high, low));
  const float smoothed = __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.f, smooth), scaled), factor),
                                   __fmul_rn(smooth, scaled));
  const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
  inv_freq[i] = medium ? smoothed : scaled;
}

}  // namespace

cudaError_t launch_rotary_scale(float* inv_freq, int rotary_dim, const RotaryScaling& r,
                                cudaStream_t stream) {
  const bool ok = r.kind == RotaryScaling::kLinear ||
                  (r.kind == RotaryScaling::kLlama3 && r.original_max_position > 0.f &&
                   r.high_freq_factor > r.low_freq_factor) ||
                  (r.kind == RotaryScaling::kYarn && r.base > 0.f && r.ramp_span > 0.f);
  if (inv_freq == nullptr || rotary_dim <= 0 || rotary_dim % 2 != 0 || !ok || !(r.factor > 0.f)) {
    return cudaErrorInvalidValue;
  }
  const int half = rotary_dim / 2;
  rotary_scale_kernel<<<ceil_div(half, 128), 128, 0, stream>>>(inv_freq, half, r, rotary_dim);
  return cudaGetLastError();
}

cudaError_t launch_rotary_inv_freq(float* out, int rotary_dim, float rotary_base,
                                   cudaStream_t stream) {
  if (out == nullptr || rotary_dim <= 0 || rotary_dim % 2 != 0 || !(rotary_base > 0.f)) {
    return cudaErrorInvalidValue;
  }
  const int half = rotary_dim / 2;
  rotary_inv_freq_kernel<<<ceil_div(half, 128), 128, 0, stream>>>(out, rotary_dim, rotary_base);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_qkv_prep(const QkvPrepParams<T>& p, cudaStream_t stream) {
  // kv_only ignores heads and q_out but needs its K/V head count, and has no rotary.
  const bool heads_ok = p.kv_only ? p.kv_heads > 0 && p.rotary_dim == 0
                                  : p.heads > 0 && p.kv_heads >= 0 &&
                                        (p.kv_heads == 0 || p.heads % p.kv_heads == 0) &&
                                        p.q_out != nullptr;
  if (p.tokens < 0 || !heads_ok || !attention_head_dim_supported(p.head_dim) || p.num_slots < 0 ||
      p.max_seq < 0 || p.qkv == nullptr || p.token_slot == nullptr || p.token_pos == nullptr ||
      p.k_cache == nullptr || p.v_cache == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (!p.kv_only && p.rotary_style != RotaryStyle::kNone &&
      (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim ||
       !(p.rotary_base > 0.f))) {
    return cudaErrorInvalidValue;
  }
  if (p.tokens == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  // Rows and heads start on 16-byte boundaries when the bases do (head_dim is a multiple of 16
  // bytes); a half-split rotation pairs vectors rot_half apart, which must then be aligned too.
  const bool vec_ok = aligned_to(p.qkv, 16) && aligned_to(p.bias, 16) && aligned_to(p.q_out, 16) &&
                      aligned_to(p.k_cache, 16) && aligned_to(p.v_cache, 16) &&
                      (p.rotary_style != RotaryStyle::kHalf || (p.rotary_dim / 2) % kVec == 0);
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(p.tokens));
  shape.block = dim3(kPrepThreads);
  return vec_ok ? launch_kernel(shape, stream, qkv_prep_kernel<T, kVec>, p)
                : launch_kernel(shape, stream, qkv_prep_kernel<T, 1>, p);
}

template cudaError_t launch_qkv_prep<float>(const QkvPrepParams<float>&, cudaStream_t);
template cudaError_t launch_qkv_prep<__half>(const QkvPrepParams<__half>&, cudaStream_t);
template cudaError_t launch_qkv_prep<__nv_bfloat16>(const QkvPrepParams<__nv_bfloat16>&,
                                                    cudaStream_t);

}  // namespace kernels
}  // namespace warpformer

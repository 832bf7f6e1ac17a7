"""Plain-PyTorch reference of warpformer's decoder, reading a converted directory.

It is the test oracle for the converters (CI has no GPU) and the CPU fallback of the Python API,
and it documents the on-disk format: every weight is used exactly as stored (linear kernels
``[in, out]``, QKV ``[h, 3, h]`` with all Q heads then K then V, ``lm_head`` ``[V, h]``). Tensor
parallel shards are merged on load. All architectures run through one layer whose behaviour is
set by :class:`~warpformer.config.GptConfig` switches:

* positions: learned ``wpe`` / ALiBi (``use_attention_linear_bias``) / rotary on the first
  ``rotary_embedding_dim`` dims of Q and K, ``interleaved`` (GPT-J pairs ``2i, 2i+1``) or ``half``
  (NeoX pairs ``i, i + r/2``);
* pre-LN ``x + f(LN(x))``, or post-LN (OPT-350m) ``LN(x + f(x))`` where ``input_layernorm`` follows
  attention and ``post_attention_layernorm`` follows the MLP;
* parallel residual ``x + attn(LN1(x)) + mlp(LN2(x))`` (NeoX), with ``LN2 = LN1`` when
  ``parallel_shared_layernorm`` (GPT-J);
* LLaMA-style: RMSNorm (``layernorm_type = rmsnorm``), a gated MLP ``act(x G) * (x U) D``,
  grouped-query attention (``kv_head_num``; each rank's Q, K, V heads side by side in the QKV
  files), a sliding window, rotary scaling (``rope_scaling_type``) and optional biases.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from .config import GptConfig
from .weights import load_merged_weights, weight_specs

__all__ = ["GptReference", "alibi_slopes", "rope_frequencies"]

_ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_erf": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes ``[num_heads]`` (fp32): geometric ``2^(-8k/n)`` for the nearest power of two
    ``n <= num_heads``, the remaining heads taking every other slope of the ``2n`` sequence."""
    pow2 = 2 ** math.floor(math.log2(num_heads))
    base = [2.0 ** (-8.0 * (k + 1) / pow2) for k in range(pow2)]
    extra = [2.0 ** (-8.0 * (k + 1) / (2 * pow2)) for k in range(0, 2 * (num_heads - pow2), 2)]
    return torch.tensor(base + extra, dtype=torch.float32)


def rope_frequencies(config: GptConfig, seq_len: int) -> tuple[torch.Tensor, float]:
    """The rotary inverse frequencies ``[dim / 2]`` (fp32, CPU) and the factor on cos/sin, as
    transformers computes them for ``config.rope_scaling_type`` (``seq_len``: the positions seen
    so far plus one, which only "dynamic" reads)."""
    c, dim = config, config.rotary_embedding_dim
    kind, factor, base = c.rope_scaling_type, c.rope_scaling_factor, c.rotary_base
    orig = c.rope_scaling_original_max_position
    if kind == "dynamic" and seq_len > orig:
        base = base * ((factor * seq_len / orig) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low, high = orig / c.rope_scaling_low_freq_factor, orig / c.rope_scaling_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low, inv_freq / factor, inv_freq)
        smooth = (orig / wavelen - c.rope_scaling_low_freq_factor) / (
            c.rope_scaling_high_freq_factor - c.rope_scaling_low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high) * ~(wavelen > low)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        def correction_dim(rotations: float) -> float:
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = correction_dim(c.rope_scaling_beta_fast), correction_dim(c.rope_scaling_beta_slow)
        if c.rope_scaling_truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        hi = hi + 0.001 if lo == hi else hi
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        extrapolate = 1 - ramp
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
        return inv, c.rope_scaling_attention_factor
    return inv_freq, 1.0


def _rotate(x: torch.Tensor, pos: torch.Tensor, dim: int, style: str,
            freqs: tuple[torch.Tensor, float]) -> torch.Tensor:
    """Rotate the first ``dim`` dims of ``x`` ``[B, T, n, d]`` by positions ``pos`` ``[B, T]``,
    ``freqs`` being :func:`rope_frequencies`' inverse frequencies and cos/sin factor."""
    inv_freq, scale = freqs[0].to(x.device), freqs[1]
    angle = pos.to(torch.float32)[..., None] * inv_freq  # [B, T, dim/2]
    cos, sin = (angle.cos() * scale)[:, :, None, :], (angle.sin() * scale)[:, :, None, :]
    rot, rest = x[..., :dim].float(), x[..., dim:]
    if style == "interleaved":
        a, b = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        a, b = rot[..., : dim // 2], rot[..., dim // 2:]
        rot = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((rot.to(x.dtype), rest), dim=-1)


class GptReference(torch.nn.Module):
    """Decoder-only transformer computing logits from full (TP-merged) converted weights.

    Args:
        config: the model's :class:`GptConfig` (``tensor_para_size`` is ignored: weights are full).
        weights: ``{name: tensor}`` with the full shapes of :func:`warpformer.weights.weight_specs`
            (``lm_head.weight`` may be absent: tied to ``wte``). All tensors must share one dtype,
            which is the compute dtype. They are kept in a plain dict (``self.w``), so build the
            model on the target device (``from_dir(..., device=...)``) rather than calling ``.to``.
    """

    def __init__(self, config: GptConfig, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        specs = weight_specs(config)
        for name, spec in specs.items():
            if name not in weights:
                if spec.optional:
                    continue
                raise KeyError(f"weight {name} (shape {list(spec.shape)}) is missing")
            if tuple(weights[name].shape) != spec.shape:
                raise ValueError(f"weight {name} has shape {list(weights[name].shape)}, "
                                 f"expected {list(spec.shape)}")
        self.w = dict(weights)
        self.act = _ACTIVATIONS[config.activation_type]
        # A call's attention window (generate's memory_len; 0: none), on top of sliding_window.
        self.memory_len = 0
        # A call's prompt table (generate's prompt embeddings): id vocab_size + j embeds as its
        # row j instead of a wte row; None: none.
        self.prompt_table: torch.Tensor | None = None
        if config.use_attention_linear_bias:  # where the weights are (the backend runs on GPUs too)
            device = next(iter(weights.values())).device
            self.register_buffer("slopes", alibi_slopes(config.head_num).to(device),
                                 persistent=False)

    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike[str],
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> GptReference:
        """Load a converted ``<tp>-gpu`` directory (any TP size) computing in ``dtype``. A
        weight-only quantized folder runs on its dequantized kernels (``(q - zero) * scale``, see
        docs/FORMAT.md): the oracle for the engine's quantized kernels."""
        config, weights = load_merged_weights(path, dtype=dtype, device=device)
        return cls(config, weights)

    # ------------------------------------------------------------------ building blocks
    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w, eps = self.w[name + ".weight"], self.config.layernorm_eps
        if self.config.rmsnorm:  # statistics in fp32, scaled in the model dtype (as HF)
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return w * xf.to(x.dtype)
        return F.layer_norm(x, (x.shape[-1],), w, self.w[name + ".bias"], eps)

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[..., heads, d]`` and k, v ``[..., kv_heads, d]`` from a QKV product (or bias)."""
        c, d = self.config, self.config.size_per_head
        lead = qkv.shape[:-1]
        if not c.grouped_query:
            return qkv.view(*lead, 3, c.head_num, d).unbind(-3)
        tp, lq, lkv = c.tensor_para_size, c.head_num // c.tensor_para_size, c.local_kv_heads
        ranks = qkv.view(*lead, tp, lq + 2 * lkv, d)
        q = ranks[..., :lq, :].reshape(*lead, c.head_num, d)
        # A rank's K/V heads are kv heads r * lkv ... (or, replicated, head r * kv / tp): keep
        # each head once, from the first rank holding it.
        first = [r for r in range(tp) if (r * c.kv_heads) % tp == 0 or c.kv_heads >= tp]
        k = ranks[..., first, lq:lq + lkv, :].reshape(*lead, c.kv_heads, d)
        v = ranks[..., first, lq + lkv:, :].reshape(*lead, c.kv_heads, d)
        return q, k, v

    def _attention(
        self,
        x: torch.Tensor,
        n: int,
        pos: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Causal self-attention of ``x`` ``[B, T, h]`` whose tokens sit at positions ``pos``
        ``[B, T]``. With ``cache`` (``k, v`` of ``[B, Tmax, heads, d]``) each token's K/V is written
        at slot ``pos`` and queries attend slots ``<= pos``; without it, the T tokens themselves."""
        c, p = self.config, f"layers.{n}.attention."
        B, T, h = x.shape
        wqkv = self.w[p + "query_key_value.weight"]
        qkv = x @ wqkv.reshape(h, -1)
        if c.has_attention_bias:
            qkv = qkv + self.w[p + "query_key_value.bias"].reshape(-1)
        q, k, v = self._split_qkv(qkv)  # [B, T, heads | kv_heads, d]
        if c.rotary_embedding_dim:
            freqs = rope_frequencies(c, int(pos.max()) + 1)
            q = _rotate(q, pos, c.rotary_embedding_dim, c.rotary_style, freqs)
            k = _rotate(k, pos, c.rotary_embedding_dim, c.rotary_style, freqs)
        if cache is None:
            key_pos = pos
        else:
            rows = torch.arange(B, device=x.device)[:, None].expand(B, T)
            cache[0][rows, pos], cache[1][rows, pos] = k, v
            k, v = cache
            key_pos = torch.arange(k.shape[1], device=x.device).expand(B, -1)
        if c.grouped_query:  # each K/V head serves head_num / kv_heads query heads
            k = k.repeat_interleave(c.head_num // c.kv_heads, dim=2)
            v = v.repeat_interleave(c.head_num // c.kv_heads, dim=2)
        scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(c.size_per_head)
        if c.use_attention_linear_bias:  # slope * key position (shift-invariant per query row)
            scores = scores + self.slopes.to(scores.dtype)[:, None, None] * key_pos[:, None, None]
        allowed = key_pos[:, None, None, :] <= pos[:, None, :, None]  # [B, 1, T, K]
        window = min((w for w in (c.sliding_window, self.memory_len) if w > 0), default=0)
        if window:  # the last `window` positions, the query's own included
            allowed = allowed & (key_pos[:, None, None, :] > pos[:, None, :, None] - window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.einsum("bnqk,bknd->bqnd", probs, v).reshape(B, T, h)
        out = out @ self.w[p + "dense.weight"]
        if c.has_attention_bias and c.has_attention_out_bias:
            out = out + self.w[p + "dense.bias"]
        return out

    def _mlp(self, x: torch.Tensor, n: int) -> torch.Tensor:
        c, p = self.config, f"layers.{n}.mlp."

        def product(name: str, t: torch.Tensor) -> torch.Tensor:
            y = t @ self.w[p + name + ".weight"]
            return y + self.w[p + name + ".bias"] if c.has_mlp_bias else y

        up = product("dense_h_to_4h", x)
        hidden = self.act(product("gate", x)) * up if c.use_gated_activation else self.act(up)
        return product("dense_4h_to_h", hidden)

    def _layer(self, x: torch.Tensor, n: int, pos: torch.Tensor, cache) -> torch.Tensor:
        c, p = self.config, f"layers.{n}."
        if c.layernorm_type == "post_layernorm":
            x = self._ln(x + self._attention(x, n, pos, cache), p + "input_layernorm")
            return self._ln(x + self._mlp(x, n), p + "post_attention_layernorm")
        a = self._ln(x, p + "input_layernorm")
        attn = self._attention(a, n, pos, cache)
        if not c.parallel_residual:
            x = x + attn
            return x + self._mlp(self._ln(x, p + "post_attention_layernorm"), n)
        m = a if c.parallel_shared_layernorm else self._ln(x, p + "post_attention_layernorm")
        return x + attn + self._mlp(m, n)

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, caches=None, hidden: bool = False):
        """Logits ``[B, T, V]`` for tokens ``ids`` ``[B, T]`` at positions ``pos`` ``[B, T]``;
        with ``hidden``, ``(logits, final hidden states [B, T, hidden_size])``: the states after
        the final norm that the head is applied to (before OPT's ``project_out``), in the model
        dtype."""
        c, w, table = self.config, self.w, self.prompt_table
        rows = 0 if table is None else table.shape[0]
        if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size + rows:
            raise ValueError(f"input_ids must be in [0, vocab_size={c.vocab_size})"
                             + (f" or the prompt table's [{c.vocab_size}, "
                                f"{c.vocab_size + rows})" if rows else ""))
        if rows:
            virtual = ids >= c.vocab_size
            x = F.embedding(ids.masked_fill(virtual, 0), w["wte"])
            x = torch.where(virtual[..., None],
                            table.to(x.dtype)[(ids - c.vocab_size).clamp(min=0)], x)
        else:
            x = F.embedding(ids, w["wte"])
        if c.word_embed_proj_dim:
            x = x @ w["project_in.weight"]
        if c.has_positional_encoding:
            if int(pos.max()) >= c.max_pos_seq_len:
                raise ValueError(f"position {int(pos.max())} exceeds max_pos_seq_len "
                                 f"({c.max_pos_seq_len})")
            x = x + F.embedding(pos, w["wpe"])
        if c.has_pre_decoder_layernorm:
            x = self._ln(x, "pre_decoder_layernorm")
        for n in range(c.num_layer):
            x = self._layer(x, n, pos, None if caches is None else caches[n])
        if c.has_post_decoder_layernorm:
            x = self._ln(x, "final_layernorm")
        final = x
        if c.word_embed_proj_dim:
            x = x @ w["project_out.weight"]
        logits = x @ w.get("lm_head.weight", w["wte"]).t()
        if c.has_lm_head_bias:
            logits = logits + w["lm_head.bias"]
        return (logits.float(), final) if hidden else logits.float()

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, input_lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits of every position.

        Args:
            input_ids: LongTensor ``[B, S]``, right-padded.
            input_lengths: optional IntTensor ``[B]`` of valid lengths (``1 <= len <= S``).
        Returns:
            FloatTensor ``[B, S, V]`` (fp32); rows past a sequence's length are unspecified.
        """
        B, S = input_ids.shape
        if input_lengths is not None:
            _check_lengths(input_lengths, B, S)
        pos = torch.arange(S, device=input_ids.device).expand(B, S)
        return self._run(input_ids.long(), pos)

    @torch.no_grad()
    def generate_greedy(
        self,
        input_ids: torch.Tensor,
        input_lengths: torch.Tensor | None,
        max_new_tokens: int,
        end_id: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding with a KV cache.

        Args:
            input_ids: LongTensor ``[B, S]`` right-padded prompts.
            input_lengths: IntTensor ``[B]`` prompt lengths (``None``: all ``S``).
            max_new_tokens: tokens to generate per row (a row stops after emitting ``end_id``).
            end_id: end-of-sequence token, or ``None`` to always generate ``max_new_tokens``.
        Returns:
            ``(output_ids, output_lengths)``: LongTensor ``[B, S + max_new_tokens]`` holding each
            prompt followed by its generated tokens (``end_id`` included), padded with ``end_id``
            (or 0); LongTensor ``[B]`` of valid lengths.
        """
        B, S = input_ids.shape
        device = input_ids.device
        lengths = (torch.full((B,), S, dtype=torch.long, device=device) if input_lengths is None
                   else input_lengths.to(device=device, dtype=torch.long))
        _check_lengths(lengths, B, S)
        c, dt = self.config, self.w["wte"].dtype
        total = S + max_new_tokens
        caches = [(torch.zeros(B, total, c.kv_heads, c.size_per_head, dtype=dt, device=device),
                   torch.zeros(B, total, c.kv_heads, c.size_per_head, dtype=dt, device=device))
                  for _ in range(c.num_layer)]
        pad = 0 if end_id is None else end_id
        out = torch.full((B, total), pad, dtype=torch.long, device=device)
        out[:, :S] = input_ids
        pos = torch.arange(S, device=device).expand(B, S)
        logits = self._run(input_ids.long(), pos, caches)
        last = logits[torch.arange(B, device=device), lengths - 1]  # [B, V]
        cur = lengths.clone()
        done = torch.zeros(B, dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            token = last.argmax(-1)
            token = torch.where(done, torch.full_like(token, pad), token)
            out[torch.arange(B, device=device), cur] = token
            cur = cur + (~done).long()
            if end_id is not None:
                done = done | (token == end_id)
            if bool(done.all()):
                break
            step_pos = (cur - 1)[:, None]
            last = self._run(token[:, None], step_pos, caches)[:, 0]
        return out, cur


def _check_lengths(lengths: torch.Tensor, batch: int, seq: int) -> None:
    if lengths.shape != (batch,):
        raise ValueError(f"input_lengths must have shape [{batch}], got {list(lengths.shape)}")
    if bool((lengths < 1).any()) or bool((lengths > seq).any()):
        raise ValueError(f"input_lengths must be in [1, {seq}], got {lengths.tolist()}")

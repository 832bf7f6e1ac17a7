"""Plain-PyTorch reference of the encoder-decoder family, reading a converted directory.

The CPU oracle for the T5 converter and layout (``docs/FORMAT.md``, "T5 family"), computing in
fp32 from the weights exactly as stored (linear kernels ``[in, out]``, decoder self-attention QKV
``[d, 3, inner]``, relative attention bias tables ``[heads, buckets]``, ``lm_head`` ``[V, d]``).
Tensor-parallel shards are merged on load. The family-specific choices sit in
:class:`Seq2SeqSpec` (norm, attention score scale, positions, head rescale) so that BART's
learned positions and biased LayerNorm can be added as further values of those switches; the
blocks (attention over a cache, cross-attention over a memory, FFN) are shared.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .t5_config import T5Config, T5StackConfig
from .t5_weights import EMBEDDING, LM_HEAD, load_merged_t5_weights, t5_weight_specs

__all__ = ["Seq2SeqReference", "Seq2SeqSpec", "relative_position_buckets"]

_ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_erf": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass(frozen=True)
class Seq2SeqSpec:
    """Family switches of the reference.

    ``norm``: ``"rms"`` (T5: ``x * rsqrt(mean(x^2) + eps) * w``, no mean, no bias).
    ``positions``: ``"relative"`` (T5 bucketed bias added to the attention scores).
    ``score_scale``: factor on ``q . k`` (T5: 1, its init folds ``d_kv ** -0.5`` into Q).
    ``head_scale``: factor on the decoder output before ``lm_head`` (T5 tied: ``d_model ** -0.5``).
    """

    norm: str
    positions: str
    score_scale: float
    head_scale: float

    @classmethod
    def for_t5(cls, config: T5Config) -> Seq2SeqSpec:
        """T5 / v1.1 / mT5 / UL2."""
        scale = config.d_model ** -0.5 if config.tie_word_embeddings else 1.0
        return cls(norm="rms", positions="relative", score_scale=1.0, head_scale=scale)


def relative_position_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> torch.Tensor:
    """T5's bucket of each ``key_position - query_position`` in ``relative`` (LongTensor, any
    shape) -> LongTensor of the same shape in ``[0, num_buckets)``.

    Bidirectional: half the buckets for keys after the query. Within a half, distances below a
    quarter (half, unidirectional) of the buckets get one bucket each; larger ones share
    logarithmically spaced buckets up to ``max_distance``, beyond which all fall into the last.
    Unidirectional (causal decoder): keys after the query count as distance 0.
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class Seq2SeqReference(torch.nn.Module):
    """Encoder-decoder transformer over full (TP-merged) converted weights, computing in fp32.

    Args:
        config: the model's :class:`T5Config` (``tensor_para_size`` ignored: weights are full).
        weights: ``{name: tensor}`` with the full shapes of :func:`t5_weight_specs`.
    """

    def __init__(self, config: T5Config, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, spec in t5_weight_specs(config).items():
            if name not in weights:
                raise KeyError(f"weight {name} (shape {list(spec.shape)}) is missing")
            if tuple(weights[name].shape) != spec.shape:
                raise ValueError(f"weight {name} has shape {list(weights[name].shape)}, "
                                 f"expected {list(spec.shape)}")
        self.config = config
        self.spec = Seq2SeqSpec.for_t5(config)
        self.w = {k: v.float() for k, v in weights.items()}

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str],
                 device: str | torch.device = "cpu") -> Seq2SeqReference:
        """Load a converted ``<tp>-gpu`` directory (any TP size)."""
        config, weights = load_merged_t5_weights(path, torch.float32, device)
        return cls(config, weights)

    # ------------------------------------------------------------------ building blocks
    def _norm(self, x: torch.Tensor, name: str, eps: float) -> torch.Tensor:
        if self.spec.norm != "rms":
            raise ValueError(f"norm {self.spec.norm!r} is not implemented")
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.w[name]

    def _ffn(self, x: torch.Tensor, prefix: str, stack: T5StackConfig) -> torch.Tensor:
        act = _ACTIVATIONS[stack.activation]
        h = act(x @ self.w[prefix + "wi.weight"])
        if stack.gated:
            h = h * (x @ self.w[prefix + "wi2.weight"])
        return h @ self.w[prefix + "wo.weight"]

    def _position_bias(self, table: str, stack: T5StackConfig, q_pos: torch.Tensor,
                       k_pos: torch.Tensor, bidirectional: bool) -> torch.Tensor:
        """``[heads, Tq, Tk]`` bias for query positions ``q_pos`` ``[Tq]`` and keys ``k_pos``."""
        buckets = relative_position_buckets(k_pos[None, :] - q_pos[:, None], bidirectional,
                                            stack.relative_attention_num_buckets,
                                            stack.relative_attention_max_distance)
        return self.w[table][:, buckets]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """``q`` ``[B, Tq, n, dk]``, ``k``/``v`` ``[B, Tk, n, dk]``, ``bias`` broadcastable to
        ``[B, n, Tq, Tk]``, ``allowed`` bool broadcastable to it -> ``[B, Tq, n * dk]``."""
        scores = torch.einsum("bqnd,bknd->bnqk", q, k) * self.spec.score_scale + bias
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = torch.einsum("bnqk,bknd->bqnd", probs, v)
        return out.reshape(out.shape[0], out.shape[1], -1)

    # ------------------------------------------------------------------ encoder
    @torch.no_grad()
    def encode(self, input_ids: torch.Tensor,
               input_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output.

        Args:
            input_ids: LongTensor ``[B, S]``, right-padded, ids in ``[0, vocab_size)``.
            input_lengths: IntTensor ``[B]`` of valid lengths in ``[1, S]`` (``None``: all ``S``).
        Returns:
            FloatTensor ``[B, S, d_model]`` (fp32) after the final norm; rows past a sequence's
            length are zero.
        """
        c, enc = self.config, self.config.encoder
        B, S = input_ids.shape
        lengths = _lengths(input_lengths, B, S, input_ids.device)
        _check_ids(input_ids, c.vocab_size, "input_ids")
        valid = torch.arange(S, device=input_ids.device)[None, :] < lengths[:, None]  # [B, S]
        pos = torch.arange(S, device=input_ids.device)
        bias = self._position_bias("encoder.block.0.layer.0.SelfAttention.relative_attention_bias"
                                   ".weight", enc, pos, pos, bidirectional=True)[None]
        allowed = valid[:, None, None, :]
        x = F.embedding(input_ids, self.w[EMBEDDING])
        n, dk = enc.num_heads, enc.d_kv
        for i in range(enc.num_layers):
            p = f"encoder.block.{i}.layer."
            h = self._norm(x, p + "0.layer_norm.weight", enc.layer_norm_epsilon)
            q, k, v = (h @ self.w[p + f"0.SelfAttention.{m}.weight"] for m in "qkv")
            a = self._attend(q.view(B, S, n, dk), k.view(B, S, n, dk), v.view(B, S, n, dk),
                             bias, allowed)
            x = x + a @ self.w[p + "0.SelfAttention.o.weight"]
            h = self._norm(x, p + "1.layer_norm.weight", enc.layer_norm_epsilon)
            x = x + self._ffn(h, p + "1.DenseReluDense.", enc)
        x = self._norm(x, "encoder.final_layer_norm.weight", enc.layer_norm_epsilon)
        return x * valid[..., None]

    # ------------------------------------------------------------------ decoder
    def _memory(self, encoder_output: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cross-attention K/V ``[B, S, n, dk]`` of every decoder layer, computed once."""
        dec = self.config.decoder
        B, S, _ = encoder_output.shape
        out = []
        for i in range(dec.num_layers):
            p = f"decoder.block.{i}.layer.1.EncDecAttention."
            k = (encoder_output @ self.w[p + "k.weight"]).view(B, S, dec.num_heads, dec.d_kv)
            v = (encoder_output @ self.w[p + "v.weight"]).view(B, S, dec.num_heads, dec.d_kv)
            out.append((k, v))
        return out

    def _decode(self, tokens: torch.Tensor, start: int, cache: list[torch.Tensor],
                memory: list[tuple[torch.Tensor, torch.Tensor]],
                memory_valid: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` of decoder tokens ``[B, T]`` at positions ``start ..``; their
        self-attention K/V are written into ``cache`` (per layer ``[2, B, Tmax, n, dk]``)."""
        c, dec = self.config, self.config.decoder
        B, T = tokens.shape
        n, dk = dec.num_heads, dec.d_kv
        device = tokens.device
        q_pos = torch.arange(start, start + T, device=device)
        k_pos = torch.arange(start + T, device=device)
        bias = self._position_bias("decoder.block.0.layer.0.SelfAttention.relative_attention_bias"
                                   ".weight", dec, q_pos, k_pos, bidirectional=False)[None]
        causal = (k_pos[None, :] <= q_pos[:, None])[None, None]  # [1, 1, T, start + T]
        cross_allowed = memory_valid[:, None, None, :]
        x = F.embedding(tokens, self.w[EMBEDDING])
        for i in range(dec.num_layers):
            p = f"decoder.block.{i}.layer."
            h = self._norm(x, p + "0.layer_norm.weight", dec.layer_norm_epsilon)
            qkv = h @ self.w[p + "0.SelfAttention.qkv.weight"].reshape(c.d_model, -1)
            q, k, v = qkv.view(B, T, 3, n, dk).unbind(2)
            cache[i][0, :, start:start + T], cache[i][1, :, start:start + T] = k, v
            a = self._attend(q, cache[i][0, :, :start + T], cache[i][1, :, :start + T], bias,
                             causal)
            x = x + a @ self.w[p + "0.SelfAttention.o.weight"]
            h = self._norm(x, p + "1.layer_norm.weight", dec.layer_norm_epsilon)
            q = (h @ self.w[p + "1.EncDecAttention.q.weight"]).view(B, T, n, dk)
            a = self._attend(q, *memory[i], torch.zeros((), device=device), cross_allowed)
            x = x + a @ self.w[p + "1.EncDecAttention.o.weight"]
            h = self._norm(x, p + "2.layer_norm.weight", dec.layer_norm_epsilon)
            x = x + self._ffn(h, p + "2.DenseReluDense.", dec)
        x = self._norm(x, "decoder.final_layer_norm.weight", dec.layer_norm_epsilon)
        return (x * self.spec.head_scale) @ self.w[LM_HEAD].t()

    def _new_cache(self, batch: int, length: int, device: torch.device) -> list[torch.Tensor]:
        dec = self.config.decoder
        return [torch.zeros(2, batch, length, dec.num_heads, dec.d_kv, device=device)
                for _ in range(dec.num_layers)]

    @torch.no_grad()
    def decoder_logits(self, encoder_output: torch.Tensor, input_lengths: torch.Tensor | None,
                       decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoder logits.

        Args:
            encoder_output: FloatTensor ``[B, S, d_model]`` from :meth:`encode`.
            input_lengths: IntTensor ``[B]`` valid encoder lengths (``None``: all ``S``).
            decoder_input_ids: LongTensor ``[B, T]`` (usually starting with
                ``decoder_start_token_id``).
        Returns:
            FloatTensor ``[B, T, vocab_size]`` (fp32).
        """
        B, S, _ = encoder_output.shape
        lengths = _lengths(input_lengths, B, S, encoder_output.device)
        _check_ids(decoder_input_ids, self.config.vocab_size, "decoder_input_ids")
        valid = torch.arange(S, device=lengths.device)[None, :] < lengths[:, None]
        T = decoder_input_ids.shape[1]
        cache = self._new_cache(B, T, encoder_output.device)
        return self._decode(decoder_input_ids.long(), 0, cache,
                            self._memory(encoder_output.float()), valid)

    @torch.no_grad()
    def generate_greedy(self, input_ids: torch.Tensor, input_lengths: torch.Tensor | None,
                        max_new_tokens: int, end_id: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding with a self-attention KV cache and cross-attention K/V computed once.

        Args:
            input_ids: LongTensor ``[B, S]`` right-padded encoder inputs.
            input_lengths: IntTensor ``[B]`` their lengths (``None``: all ``S``).
            max_new_tokens: tokens to generate per row (``>= 1``); a row stops after ``end_id``.
            end_id: end token (default: the config's ``eos_token_id``).
        Returns:
            ``(tokens, lengths)``: LongTensor ``[B, max_new_tokens]`` of generated ids (without
            the decoder start token; ``end_id`` included, then ``pad_token_id``), and LongTensor
            ``[B]`` of generated counts.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        c = self.config
        end = c.eos_token_id if end_id is None else end_id
        B, S = input_ids.shape
        device = input_ids.device
        lengths = _lengths(input_lengths, B, S, device)
        memory = self._memory(self.encode(input_ids, lengths))
        valid = torch.arange(S, device=device)[None, :] < lengths[:, None]
        cache = self._new_cache(B, max_new_tokens, device)
        out = torch.full((B, max_new_tokens), c.pad_token_id, dtype=torch.long, device=device)
        count = torch.zeros(B, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        token = torch.full((B,), c.decoder_start_token_id, dtype=torch.long, device=device)
        for step in range(max_new_tokens):
            logits = self._decode(token[:, None], step, cache, memory, valid)[:, 0]
            token = torch.where(done, torch.full_like(token, c.pad_token_id), logits.argmax(-1))
            out[:, step] = token
            count = count + (~done).long()
            done = done | (token == end)
            if bool(done.all()):
                break
        return out, count


def _lengths(lengths: torch.Tensor | None, batch: int, seq: int,
             device: torch.device) -> torch.Tensor:
    if lengths is None:
        return torch.full((batch,), seq, dtype=torch.long, device=device)
    lengths = torch.as_tensor(lengths, device=device).long()
    if lengths.shape != (batch,):
        raise ValueError(f"input_lengths must have shape [{batch}], got {list(lengths.shape)}")
    if bool((lengths < 1).any()) or bool((lengths > seq).any()):
        raise ValueError(f"input_lengths must be in [1, {seq}], got {lengths.tolist()}")
    return lengths


def _check_ids(ids: torch.Tensor, vocab: int, name: str) -> None:
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"{name} must be a non-empty [batch, length] tensor, got shape "
                         f"{list(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"{name} must be in [0, vocab_size={vocab})")

"""Plain-PyTorch reference of the encoder-decoder families, reading a converted directory.

The CPU oracle for the T5 and BART converters and layouts (``docs/FORMAT.md``, "T5 family",
"BART family"), computing in fp32 from the weights exactly as stored (linear kernels
``[in, out]``, decoder self-attention QKV ``[d, 3, inner]``, relative attention bias tables
``[heads, buckets]``, learned position tables ``[positions, d]``, ``lm_head`` ``[V, d]``).
Tensor-parallel shards are merged on load. The family-specific choices sit in
:class:`Seq2SeqSpec` (norm, positions, norm placement, embedding and final norms, attention score
scale, head rescale); tensors are found by role through
:func:`~warpformer.t5_weights.layer_names` / :func:`~warpformer.t5_weights.model_names`, and a
bias is added wherever the layout has one. The blocks (attention over a cache, cross-attention
over a memory, FFN) are shared.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from .reference_generation import Decoding, StepwiseEngine, _Options
from .t5_config import T5Config, T5StackConfig
from .t5_weights import bias_name, layer_names, load_merged_t5_weights, model_names, t5_weight_specs

__all__ = ["Seq2SeqReference", "Seq2SeqReferenceEngine", "Seq2SeqSpec", "UNSUPPORTED_OPTIONS",
           "relative_position_buckets"]

# Options of the decode dict that only a decoder-only model has, and why (the messages of
# Seq2SeqReferenceEngine and warpformer.Seq2Seq). return_cum_log_probs: its mode 2 only.
UNSUPPORTED_OPTIONS = {
    "session": "interactive sessions keep a decoder-only model's prompt in its cache",
    "prompt_table": "prompt embeddings stand in for a decoder-only model's prompt tokens",
    "memory_len": "the attention window bounds a decoder-only model's prompt and output",
    "return_context_embeddings": "the input's final hidden states are the encoder's output "
                                 "(encode)",
    "return_cum_log_probs": "mode 2 adds the prompt's log probs, and the decoder has no prompt "
                            "(use 1)",
}

_ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_erf": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass(frozen=True)
class Seq2SeqSpec:
    """Family switches of the reference.

    ``norm``: ``"rms"`` (T5: ``x * rsqrt(mean(x^2) + eps) * w``, no mean, no bias) or ``"layer"``
    (BART: LayerNorm with bias). ``positions``: ``"relative"`` (T5 bucketed bias added to the
    attention scores) or ``"learned"`` (BART: a table row added to the embedding; HF's offset of
    2 rows is dropped by the converter, as FT does, so row ``p`` is position ``p``).
    ``pre_norm``: norm before each sublayer (T5, mBART) or after the residual add (BART).
    ``embedding_norm``: a norm on the embeddings (BART's ``layernorm_embedding``).
    ``final_norm``: a norm after the last layer of each stack (T5, mBART).
    ``scaled_scores``: scores are ``q . k * d_kv ** -0.5`` (BART) or ``q . k`` (T5, its init folds
    the scale into Q). ``head_scale``: factor on the decoder output before ``lm_head`` (T5 tied:
    ``d_model ** -0.5``). BART's ``sqrt(d_model)`` embedding scale (``scale_embedding``) is
    folded into the ``embed_tokens`` files by the converter (FT's layout), so none is applied
    here; ``final_logits_bias`` is added when the layout has it.
    """

    norm: str
    positions: str
    head_scale: float
    pre_norm: bool = True
    embedding_norm: bool = False
    final_norm: bool = True
    scaled_scores: bool = False

    @classmethod
    def for_config(cls, config: T5Config) -> Seq2SeqSpec:
        """The spec of ``config``'s family."""
        return cls.for_bart(config) if config.is_bart else cls.for_t5(config)

    @classmethod
    def for_t5(cls, config: T5Config) -> Seq2SeqSpec:
        """T5 / v1.1 / mT5 / UL2."""
        scale = config.d_model ** -0.5 if config.tie_word_embeddings else 1.0
        return cls(norm="rms", positions="relative", head_scale=scale)

    @classmethod
    def for_bart(cls, config: T5Config) -> Seq2SeqSpec:
        """BART (post-LN) and mBART (pre-LN with final norms); head tied without rescale."""
        return cls(norm="layer", positions="learned", head_scale=1.0,
                   pre_norm=config.pre_layernorm, embedding_norm=True,
                   final_norm=config.pre_layernorm, scaled_scores=True)


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
        self.spec = Seq2SeqSpec.for_config(config)
        self.names = model_names(config)
        self.w = {k: v.float() for k, v in weights.items()}

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str],
                 device: str | torch.device = "cpu") -> Seq2SeqReference:
        """Load a converted ``<tp>-gpu`` directory (any TP size)."""
        config, weights = load_merged_t5_weights(path, torch.float32, device)
        return cls(config, weights)

    # ------------------------------------------------------------------ building blocks
    def _norm(self, x: torch.Tensor, name: str, eps: float) -> torch.Tensor:
        if self.spec.norm == "rms":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.w[name]
        if self.spec.norm == "layer":
            w = self.w[name]
            return F.layer_norm(x, w.shape, w, self.w[bias_name(name)], eps)
        raise ValueError(f"norm {self.spec.norm!r} is not implemented")

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x @ W (+ b)`` with kernel ``name`` ``[in, *out]`` flattened to ``[in, out]``."""
        w = self.w[name]
        y = x @ w.reshape(w.shape[0], -1)
        b = self.w.get(bias_name(name))
        return y if b is None else y + b.reshape(-1)

    def _residual(self, x: torch.Tensor, norm: str, eps: float,
                  block: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """One sublayer: ``x + block(norm(x))`` (pre-norm) or ``norm(x + block(x))``."""
        if self.spec.pre_norm:
            return x + block(self._norm(x, norm, eps))
        return self._norm(x + block(x), norm, eps)

    def _ffn(self, names: dict[str, str], stack: T5StackConfig, x: torch.Tensor) -> torch.Tensor:
        h = _ACTIVATIONS[stack.activation](self._linear(x, names["ffn_in"]))
        if "ffn_gate" in names:
            h = h * self._linear(x, names["ffn_gate"])
        return self._linear(h, names["ffn_out"])

    def _embed(self, stack_name: str, ids: torch.Tensor, pos: torch.Tensor,
               stack: T5StackConfig) -> torch.Tensor:
        """Embeddings ``[B, T, d]`` of ``ids`` ``[B, T]`` at positions ``pos`` ``[T]``."""
        x = F.embedding(ids, self.w[self.names[f"{stack_name}_embedding"]])
        if self.spec.positions == "learned":
            table = self.w[self.names[f"{stack_name}_positions"]]
            if int(pos[-1]) >= table.shape[0]:
                raise ValueError(f"{stack_name} position {int(pos[-1])} is beyond "
                                 f"max_pos_seq_len ({table.shape[0]})")
            x = x + table[pos]
        if self.spec.embedding_norm:
            x = self._norm(x, self.names[f"{stack_name}_embedding_norm"],
                           stack.layer_norm_epsilon)
        return x

    def _finish(self, stack_name: str, x: torch.Tensor, stack: T5StackConfig) -> torch.Tensor:
        if self.spec.final_norm:
            x = self._norm(x, self.names[f"{stack_name}_final_norm"], stack.layer_norm_epsilon)
        return x

    def _position_bias(self, stack_name: str, stack: T5StackConfig, q_pos: torch.Tensor,
                       k_pos: torch.Tensor, bidirectional: bool) -> torch.Tensor:
        """``[heads, Tq, Tk]`` bias for query positions ``q_pos`` ``[Tq]`` and keys ``k_pos``
        (a zero scalar for learned positions)."""
        if self.spec.positions != "relative":
            return torch.zeros((), device=q_pos.device)
        buckets = relative_position_buckets(k_pos[None, :] - q_pos[:, None], bidirectional,
                                            stack.relative_attention_num_buckets,
                                            stack.relative_attention_max_distance)
        return self.w[self.names[f"{stack_name}_positions"]][:, buckets]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """``q`` ``[B, Tq, n, dk]``, ``k``/``v`` ``[B, Tk, n, dk]``, ``bias`` broadcastable to
        ``[B, n, Tq, Tk]``, ``allowed`` bool broadcastable to it -> ``[B, Tq, n * dk]``."""
        scores = torch.einsum("bqnd,bknd->bnqk", q, k)
        if self.spec.scaled_scores:
            scores = scores * q.shape[-1] ** -0.5
        probs = torch.softmax((scores + bias).masked_fill(~allowed, float("-inf")), dim=-1)
        out = torch.einsum("bnqk,bknd->bqnd", probs, v)
        return out.reshape(out.shape[0], out.shape[1], -1)

    def _encoder_attention(self, names: dict[str, str], stack: T5StackConfig, bias: torch.Tensor,
                           allowed: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        B, S, _ = h.shape
        q, k, v = (self._linear(h, names[f"self_{m}"]).view(B, S, stack.num_heads, stack.d_kv)
                   for m in "qkv")
        return self._linear(self._attend(q, k, v, bias, allowed), names["self_o"])

    def _cached_attention(self, names: dict[str, str], stack: T5StackConfig,
                          cache: torch.Tensor, start: int, bias: torch.Tensor,
                          causal: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Decoder self-attention of ``h`` ``[B, T, d]`` at positions ``start ..``; its K/V are
        written into ``cache`` ``[2, B, Tmax, n, dk]``."""
        B, T, _ = h.shape
        qkv = self._linear(h, names["self_qkv"])
        q, k, v = qkv.view(B, T, 3, stack.num_heads, stack.d_kv).unbind(2)
        cache[0, :, start:start + T], cache[1, :, start:start + T] = k, v
        a = self._attend(q, cache[0, :, :start + T], cache[1, :, :start + T], bias, causal)
        return self._linear(a, names["self_o"])

    def _cross_attention(self, names: dict[str, str], stack: T5StackConfig,
                         memory: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor,
                         h: torch.Tensor) -> torch.Tensor:
        """``h`` ``[R, T, d]`` over ``memory`` ``[Bm, S, n, dk]`` with ``R = G * Bm``: rows
        ``b * G .. b * G + G - 1`` (an entry's beams) share entry ``b``'s memory, attending as
        ``G * T`` queries of it (no copy of the memory per beam)."""
        R, T, _ = h.shape
        Bm = memory[0].shape[0]
        q = self._linear(h, names["cross_q"]).view(Bm, R // Bm * T, stack.num_heads, stack.d_kv)
        a = self._attend(q, *memory, torch.zeros((), device=h.device), allowed)
        return self._linear(a.reshape(R, T, -1), names["cross_o"])

    # ------------------------------------------------------------------ encoder
    @torch.no_grad()
    def encode(self, input_ids: torch.Tensor,
               input_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output.

        Args:
            input_ids: LongTensor ``[B, S]``, right-padded, ids in ``[0, vocab_size)``.
            input_lengths: IntTensor ``[B]`` of valid lengths in ``[1, S]`` (``None``: all ``S``).
        Returns:
            FloatTensor ``[B, S, d_model]`` (fp32) after the last layer (and the final norm
            where the family has one); rows past a sequence's length are zero.
        """
        c, enc = self.config, self.config.encoder
        B, S = input_ids.shape
        lengths = _lengths(input_lengths, B, S, input_ids.device)
        _check_ids(input_ids, c.vocab_size, "input_ids")
        valid = torch.arange(S, device=input_ids.device)[None, :] < lengths[:, None]  # [B, S]
        pos = torch.arange(S, device=input_ids.device)
        bias = self._position_bias("encoder", enc, pos, pos, bidirectional=True)[None]
        allowed = valid[:, None, None, :]
        eps = enc.layer_norm_epsilon
        x = self._embed("encoder", input_ids, pos, enc)
        for i in range(enc.num_layers):
            n = layer_names(c, "encoder", i)
            x = self._residual(x, n["self_norm"], eps,
                               partial(self._encoder_attention, n, enc, bias, allowed))
            x = self._residual(x, n["ffn_norm"], eps, partial(self._ffn, n, enc))
        return self._finish("encoder", x, enc) * valid[..., None]

    # ------------------------------------------------------------------ decoder
    def _memory(self, encoder_output: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cross-attention K/V ``[B, S, n, dk]`` of every decoder layer, computed once."""
        c, dec = self.config, self.config.decoder
        B, S, _ = encoder_output.shape
        out = []
        for i in range(dec.num_layers):
            n = layer_names(c, "decoder", i)
            k, v = (self._linear(encoder_output, n[f"cross_{m}"]).view(B, S, dec.num_heads,
                                                                       dec.d_kv) for m in "kv")
            out.append((k, v))
        return out

    def _decode(self, tokens: torch.Tensor, start: int, cache: list[torch.Tensor],
                memory: list[tuple[torch.Tensor, torch.Tensor]], memory_valid: torch.Tensor,
                hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, V]`` of decoder tokens ``[B, T]`` at positions ``start ..``; their
        self-attention K/V are written into ``cache`` (per layer ``[2, B, Tmax, n, dk]``).
        ``memory`` / ``memory_valid`` may hold ``B / G`` entries, each shared by ``G``
        consecutive rows (beams). ``hidden``: also return the final hidden states ``[B, T, d]``
        (after the final norm, before T5's head rescale: what HF reports as the decoder's last
        hidden state)."""
        c, dec = self.config, self.config.decoder
        T = tokens.shape[1]
        device = tokens.device
        q_pos = torch.arange(start, start + T, device=device)
        k_pos = torch.arange(start + T, device=device)
        bias = self._position_bias("decoder", dec, q_pos, k_pos, bidirectional=False)[None]
        causal = (k_pos[None, :] <= q_pos[:, None])[None, None]  # [1, 1, T, start + T]
        cross_allowed = memory_valid[:, None, None, :]
        eps = dec.layer_norm_epsilon
        x = self._embed("decoder", tokens, q_pos, dec)
        for i in range(dec.num_layers):
            n = layer_names(c, "decoder", i)
            x = self._residual(x, n["self_norm"], eps, partial(
                self._cached_attention, n, dec, cache[i], start, bias, causal))
            x = self._residual(x, n["cross_norm"], eps, partial(
                self._cross_attention, n, dec, memory[i], cross_allowed))
            x = self._residual(x, n["ffn_norm"], eps, partial(self._ffn, n, dec))
        x = self._finish("decoder", x, dec)
        logits = (x * self.spec.head_scale) @ self.w[self.names["lm_head"]].t()
        if "logits_bias" in self.names:
            logits = logits + self.w[self.names["logits_bias"]]
        return (logits, x) if hidden else logits

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


# ----------------------------------------------------------------------------- generation
class _DecoderAdapter:
    """The decoder of a :class:`Seq2SeqReference` as the generation loop's model
    (:class:`~warpformer.reference_generation.DecoderAdapter`): the cross-attention K/V of each
    batch entry computed once from its encoder output and shared by its beams, and a
    self-attention KV cache per row, which beams reorder."""

    def __init__(self, model: Seq2SeqReference, encoder_output: torch.Tensor,
                 lengths: torch.Tensor, max_len: int) -> None:
        B, S, _ = encoder_output.shape
        self.model = model
        self.memory = model._memory(encoder_output)
        self.valid = torch.arange(S, device=lengths.device)[None, :] < lengths[:, None]
        self.cache = model._new_cache(B, max_len, encoder_output.device)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(positions[0])
        if bool((positions != start).any()):  # every decoder row starts at the same length
            raise RuntimeError(f"decoder rows at different positions {positions.tolist()}")
        logits, hidden = self.model._decode(tokens[:, None], start, self.cache, self.memory,
                                            self.valid, hidden=True)
        return logits[:, 0], hidden[:, 0]

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache = [c[:, rows] for c in self.cache]


def _renamed(message: str) -> str:
    """A ``generation_options`` message as this model's (the op names ``GptModel.decode``)."""
    return message.replace("GptModel.decode", "Seq2SeqModel.decode", 1)


class Seq2SeqReferenceEngine(StepwiseEngine):
    """Plain-PyTorch twin of ``torch.classes.warpformer.Seq2SeqModel``: ``encode``, ``decode``,
    ``decode_start``, ``decode_step``, ``decode_finish``, ``max_batch``, ``max_seq_len``.

    ``input_ids`` are the encoder's (``[B, S]``, right padded); the outputs are the decoder's:
    ``output_ids`` int32 ``[B, beam, 1 + output_len]``, column 0 the decoder start token, then
    the generated tokens (``end_id`` past a row's end), ``sequence_lengths`` counting the start
    token, and ``cum_log_probs`` / ``output_log_probs`` / ``hidden_states`` as
    ``docs/GENERATION_API.md`` has them for GPT. The options are GPT's (the same loop runs
    them; penalties, bad and stop words see the start token as the decoder's prompt), less
    :data:`UNSUPPORTED_OPTIONS`, refused naming the option.

    Args:
        model: the reference model (fp32).
        max_batch: the largest batch a call may use.
        max_seq_len: the longest encoder input, and the most decoder tokens (``1 +
            output_len``).
    """

    def __init__(self, model: Seq2SeqReference, max_batch: int, max_seq_len: int) -> None:
        self.model = model
        super().__init__(max_batch, max_seq_len)
        self.config = model.config

    @property
    def device(self) -> torch.device:
        """Where the model's weights live (inputs are moved there; outputs are returned there)."""
        return self.model.w[self.model.names["lm_head"]].device

    def _inputs(self, op: str, input_ids: torch.Tensor, input_lengths: torch.Tensor,
                output_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked ``(ids, lengths)``, long, on :attr:`device`, ids zero past each length."""
        if input_ids.dim() != 2 or input_lengths.shape != (input_ids.shape[0],):
            raise RuntimeError(f"{op}: input_ids must be [B, S] and input_lengths [B], got "
                               f"{list(input_ids.shape)} and {list(input_lengths.shape)}")
        if input_ids.dtype.is_floating_point or input_lengths.dtype.is_floating_point:
            raise RuntimeError(f"{op}: input_ids and input_lengths must be integer tensors, got "
                               f"{input_ids.dtype} and {input_lengths.dtype}")
        B, S = input_ids.shape
        if not 1 <= B <= self._max_batch:
            raise RuntimeError(f"{op}: batch size {B} must be in [1, max_batch = "
                               f"{self._max_batch}]")
        if not 1 <= S <= self._max_seq_len:
            raise RuntimeError(f"{op}: encoder input length {S} must be in [1, max_seq_len = "
                               f"{self._max_seq_len}]")
        if output_len is not None and not 1 <= output_len <= self._max_seq_len - 1:
            raise RuntimeError(f"{op}: output_len {output_len} must be in [1, max_seq_len - 1 = "
                               f"{self._max_seq_len - 1}] (the decoder holds the start token "
                               "and the output)")
        ids = input_ids.to(self.device).long()
        lengths = input_lengths.to(self.device).long()
        if bool((lengths < 1).any()) or bool((lengths > S).any()):
            raise RuntimeError(f"{op}: input_lengths must be in [1, {S}], got {lengths.tolist()}")
        valid = torch.arange(S, device=ids.device)[None] < lengths[:, None]
        bad = valid & ((ids < 0) | (ids >= self.config.vocab_size))
        if bool(bad.any()):
            b, s = (int(v) for v in bad.nonzero()[0])
            raise RuntimeError(f"{op}: input_ids[{b}, {s}] = {int(ids[b, s])} is outside the "
                               f"vocabulary [0, {self.config.vocab_size})")
        return ids.masked_fill(~valid, 0), lengths

    @torch.no_grad()
    def encode(self, input_ids: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
        """The encoder's output fp32 ``[B, S, d_model]``, zeros past each row's length."""
        return self.model.encode(*self._inputs("Seq2SeqModel.encode", input_ids, input_lengths,
                                               None))

    @torch.no_grad()
    def decode_start(self, input_ids: torch.Tensor, input_lengths: torch.Tensor, output_len: int,
                     options: dict[str, torch.Tensor]) -> None:
        """Validate, encode, feed the decoder start token and prepare the per-row state.

        Args:
            input_ids: integer ``[B, S]`` right-padded encoder input.
            input_lengths: integer ``[B]`` its lengths in ``[1, S]``.
            output_len: tokens to generate, ``1 .. max_seq_len - 1``.
            options: ``docs/GENERATION_API.md``'s option dict, checked by the engine's rules
                (``torch.ops.warpformer.generation_options``), less :data:`UNSUPPORTED_OPTIONS`.
        """
        self._state = None
        ids, lengths = self._inputs("Seq2SeqModel.decode", input_ids, input_lengths, output_len)
        c, B, dev = self.config, ids.shape[0], ids.device
        try:
            o = _Options.parse(options, B, c.vocab_size, c.eos_token_id)
        except RuntimeError as exc:
            raise RuntimeError(_renamed(str(exc))) from None
        given = {"session": o.session, "prompt_table": o.prompt_table is not None,
                 "memory_len": o.memory_len,
                 "return_context_embeddings": o.return_context_embeddings,
                 "return_cum_log_probs": o.return_cum_log_probs == 2}
        for key, value in given.items():
            if value:
                raise RuntimeError(f"Seq2SeqModel.decode: option '{key}' is not supported by "
                                   f"encoder-decoder models: {UNSUPPORTED_OPTIONS[key]}")
        decoder = _DecoderAdapter(self.model, self.model.encode(ids, lengths), lengths,
                                  1 + output_len)
        start = torch.full((B, 1), c.decoder_start_token_id, dtype=torch.long, device=dev)
        last, last_hidden = decoder.step(start[:, 0], torch.zeros(B, dtype=torch.long,
                                                                 device=dev))
        self._state = Decoding(decoder, o, start, torch.ones(B, dtype=torch.long, device=dev),
                               output_len, last, last_hidden, vocab=c.vocab_size)

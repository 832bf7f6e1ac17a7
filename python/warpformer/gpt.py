"""``warpformer.GPT``: load a converted GPT-family checkpoint and generate, stream or score.

    >>> gpt = warpformer.GPT.from_pretrained("out/1-gpu", dtype=torch.float16)
    >>> out = gpt.generate([[464, 2068, 7586]], max_new_tokens=32, do_sample=True, top_p=0.9,
    ...                    seed=0)
    >>> out.tokens[0][0]            # row 0, best beam: the generated ids
    >>> for step in gpt.generate_stream([[464, 2068]], 32):  # [B, 1] new ids per step
    ...     ...

Two backends run the same options: ``"cuda"`` (``torch.classes.warpformer.GptModel``, the C++
engine, ``docs/GENERATION_API.md``) and ``"reference"`` (:mod:`warpformer.reference_generation`,
plain PyTorch on CPU or GPU). ``backend="auto"`` picks cuda when a GPU is visible. Argument
errors raise ``ValueError`` naming the argument before anything runs on the device.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import _in_flight
from .config import GptConfig, QuantScheme
from .generation_api import (
    GenerationOutput,
    IdsLike,
    _check_new_tokens,
    _cuda_available,
    _GenerationAPI,
    _option_kwargs,
    _tensor,
)
from .options import EngineOptions
from .prompt_embeddings import prompt_inputs
from .weights import read_config, resolve_model_dir
from .words import WordsLike, words_to_ft

if TYPE_CHECKING:
    from .reference_generation import ReferenceEngine
    from .session import GenerationSession

__all__ = ["GPT", "GenerationOutput", "words_to_ft"]

class GPT(_GenerationAPI):
    """A converted GPT-family model (GPT-2, Megatron GPT, OPT, BLOOM, GPT-J, GPT-NeoX) ready to
    generate. Build it with :meth:`from_pretrained`."""

    def __init__(self, engine: torch.ScriptObject | ReferenceEngine, config: GptConfig,
                 backend: str, dtype: torch.dtype, device: torch.device) -> None:
        self.engine = engine
        """``torch.classes.warpformer.GptModel`` (cuda) or ``ReferenceEngine`` (reference)."""
        # Read once: each engine method call from Python costs ~25 us, and the limits are fixed
        # at construction.
        self._max_batch, self._max_seq_len = int(engine.max_batch()), int(engine.max_seq_len())
        self.config = config
        self.backend = backend
        self.dtype = dtype
        self.device = device
        self._replicas: list[torch.ScriptObject] = []  # generate_batches' extra instances

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, converted_dir: str | os.PathLike[str],
                        dtype: torch.dtype = torch.float16, tensor_para_size: int = 1,
                        pipeline_para_size: int = 1, max_batch: int = 8,
                        max_seq_len: int | None = None, device: str | torch.device | None = None,
                        backend: str = "auto", *, cuda_graphs: bool = True,
                        prefill_tokens: int | None = None, peer_allreduce: bool = True,
                        gemm_config: str | os.PathLike[str] | None = None,
                        weight_quant: str | QuantScheme | None = None) -> GPT:
        """Load a directory written by ``warpformer convert`` (``OUT`` or ``OUT/<tp>-gpu``).

        Args:
            converted_dir: the converted checkpoint.
            dtype: compute dtype, ``torch.float32``/``float16``/``bfloat16`` (FT ``--data_type``).
                The reference backend on CPU computes fp16 in fp32 (CPU half GEMMs are slow).
            tensor_para_size, pipeline_para_size: FT's ``tensor_para_size`` /
                ``pipeline_para_size``; > 1 runs through :mod:`warpformer.distributed` (start the
                script with ``torchrun``/``mpirun``, one process per GPU).
            max_batch: the largest batch a call may use (FT ``max_batch_size``); the engine
                reserves its KV cache for it.
            max_seq_len: the largest prompt + new tokens (default: the position table, or 2048).
            device: where the model lives (default ``cuda`` for the cuda backend, ``cpu`` for the
                reference).
            backend: ``"cuda"``, ``"reference"`` or ``"auto"`` (cuda when a GPU is visible, else
                the reference with a warning).
            cuda_graphs, prefill_tokens, peer_allreduce, gemm_config: the engine options
                (:mod:`warpformer.options` documents them; the reference backend has none).
            weight_quant: ``"int8"``, ``"int4"`` or a :class:`~warpformer.config.QuantScheme`:
                quantize an fp16/bf16 folder at load, as ``warpformer convert --weight-quant``
                would. A quantized folder loads as stored (a request must match it: a string its
                mode, a scheme every field). The cuda backend runs the quantized kernels (fp16 /
                bf16, the head unquantized; quantizing at load on one GPU, a converted folder
                for tensor or pipeline parallelism); the reference runs the dequantized weights.
        """
        from .models.gpt import default_max_seq_len, dtype_name

        dtype_name(dtype)  # ValueError for unsupported dtypes
        options = EngineOptions(cuda_graphs=cuda_graphs, prefill_tokens=prefill_tokens,
                                peer_allreduce=peer_allreduce, gemm_config=gemm_config)
        if backend not in ("auto", "cuda", "reference"):
            raise ValueError(f"backend must be 'auto', 'cuda' or 'reference', got {backend!r}")
        for arg, value in (("tensor_para_size", tensor_para_size),
                           ("pipeline_para_size", pipeline_para_size), ("max_batch", max_batch)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive integer, got {value!r}")
        from .weight_quant import resolve_request

        path = resolve_model_dir(converted_dir)
        config = read_config(path)
        scheme = resolve_request(path, config, weight_quant)
        limit = max_seq_len if max_seq_len is not None else default_max_seq_len(config)
        if limit < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {limit}")
        if config.has_positional_encoding and limit > config.max_pos_seq_len:
            raise ValueError(f"max_seq_len ({limit}) exceeds the model's position table "
                             f"(max_pos_seq_len = {config.max_pos_seq_len})")
        parallel = tensor_para_size * pipeline_para_size > 1
        if backend == "auto":
            if _cuda_available() or parallel:
                backend = "cuda"
            else:
                backend = "reference"
                warnings.warn("warpformer: no CUDA device visible; using the plain-PyTorch "
                              "reference backend on CPU (slow, same results)", stacklevel=2)
        quant = scheme or config.quant
        if backend == "cuda" and quant is not None:
            if scheme is not None and parallel:
                raise ValueError(f"weight_quant={weight_quant!r} quantizes at load on one GPU; "
                                 "for tensor or pipeline parallelism convert with warpformer "
                                 "convert --weight-quant and load that folder")
            if quant.lm_head:
                raise ValueError("a quantized lm_head (quant_lm_head) runs on the reference "
                                 "backend only: the engine's head stays in the model dtype; "
                                 "quantize without lm_head or use backend='reference'")
            if dtype == torch.float32:
                raise ValueError(f"weight-only {quant.mode} weights run in float16 or bfloat16 "
                                 "on the cuda backend, not float32")
        if backend == "reference":
            if parallel:
                raise ValueError("tensor_para_size/pipeline_para_size > 1 need backend='cuda' "
                                 "(the reference backend merges all shards on one device)")
            return cls._load_reference(path, config, dtype, max_batch, limit, device, scheme)
        if not _cuda_available():
            raise ValueError("backend='cuda' needs a CUDA device and none is visible; use "
                             "backend='reference' (or 'auto') to run on CPU")
        if config.tensor_para_size != tensor_para_size:
            raise ValueError(f"tensor_para_size={tensor_para_size} but {path} was converted for "
                             f"tensor_para_size {config.tensor_para_size}; pass "
                             f"{config.tensor_para_size} or reconvert")
        device = torch.device(device if device is not None else "cuda")
        if parallel:
            engine = cls._load_distributed(path, dtype, tensor_para_size, pipeline_para_size,
                                           max_batch, limit, options)
        elif scheme is not None:
            engine, config = cls._load_quantized(path, config, scheme, dtype, device, max_batch,
                                                 limit, options)
        else:
            from .models.gpt import load_gpt_model

            engine = load_gpt_model(path, dtype=dtype, device=device, max_batch=max_batch,
                                    max_seq_len=limit, options=options)
        return cls(engine, config, "cuda", dtype, device)

    @staticmethod
    def _load_quantized(path, config, scheme, dtype, device, max_batch, limit, options):
        """The engine on an fp16/bf16 folder quantized at load: ``(engine, quantized config)``."""
        from .models.gpt import build_gpt_model
        from .weight_quant import quantize_weights
        from .weights import load_merged_weights

        # Dense weights stay on the CPU; each tensor is quantized on the GPU as it goes, so the
        # GPU never holds the dense model (a model that fits only quantized still loads).
        _, dense = load_merged_weights(path, device="cpu")
        config, stored = quantize_weights(config, dense, scheme, device=device)
        del dense
        engine = build_gpt_model(config, stored, dtype=dtype, max_batch=max_batch,
                                 max_seq_len=limit, options=options)
        return engine, config

    @classmethod
    def _load_reference(cls, path, config, dtype, max_batch, limit, device, scheme) -> GPT:
        from .reference import GptReference
        from .reference_generation import ReferenceEngine
        from .weight_quant import quantize_at_load
        from .weights import load_merged_weights

        device = torch.device(device if device is not None else "cpu")
        compute = torch.float32 if (device.type == "cpu" and dtype == torch.float16) else dtype
        if scheme is None:  # a quantized folder is dequantized to compute
            model = GptReference.from_dir(path, dtype=compute, device=device)
        else:
            _, dense = load_merged_weights(path, device=device)
            config, weights = quantize_at_load(config, dense, scheme, compute)
            model = GptReference(config, weights)
        return cls(ReferenceEngine(model, max_batch, limit), config, "reference", compute, device)

    @staticmethod
    def _load_distributed(path, dtype, tp, pp, max_batch, limit, options):
        try:
            from . import distributed
        except ImportError as exc:
            raise ValueError(
                f"tensor_para_size={tp}, pipeline_para_size={pp} needs warpformer.distributed, "
                f"which this installation lacks ({exc}); use tensor_para_size=1 and "
                "pipeline_para_size=1") from exc
        return distributed.load_gpt_model(path, dtype=dtype, tensor_para_size=tp,
                                          pipeline_para_size=pp, max_batch=max_batch,
                                          max_seq_len=limit, options=options)

    @property
    def vocab_size(self) -> int:
        """``V``: the checkpoint's vocabulary size (token ids are in ``[0, V)``)."""
        return self.config.vocab_size

    @property
    def end_id(self) -> int:
        """The checkpoint's end-of-sequence id (the default ``end_id`` of :meth:`generate`)."""
        return self.config.end_id

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id of the checkpoint: ``end_id``, then ``extra_end_ids`` (Llama 3
        Instruct has three). Without ``end_id``, :meth:`generate` ends a row at any of them."""
        return self.config.end_ids

    def _check_limits(self, batch: int, seq: int, new_tokens: int) -> None:
        if batch > self.max_batch:
            raise ValueError(f"batch size {batch} exceeds max_batch ({self.max_batch}) given to "
                             "from_pretrained")
        if seq + new_tokens > self.max_seq_len:
            raise ValueError(f"input length {seq} + max_new_tokens {new_tokens} = "
                             f"{seq + new_tokens} exceeds max_seq_len ({self.max_seq_len})")

    # ------------------------------------------------------------------ generation
    def generate(self, input_ids: IdsLike | None, max_new_tokens: int, *,
                 input_lengths: torch.Tensor | Sequence[int] | None = None,
                 do_sample: bool = False, top_k: int | Sequence[int] | None = None,
                 top_p: float | Sequence[float] | None = None,
                 temperature: float | Sequence[float] = 1.0,
                 repetition_penalty: float | Sequence[float] = 1.0,
                 presence_penalty: float | Sequence[float] = 0.0,
                 frequency_penalty: float | Sequence[float] = 0.0,
                 min_length: int | Sequence[int] = 0, num_beams: int = 1,
                 length_penalty: float = 1.0, diversity_rate: float = 0.0,
                 stop_words: WordsLike | None = None, bad_words: WordsLike | None = None,
                 end_id: int | Sequence[int] | None = None,
                 seed: int | Sequence[int] | None = None, return_log_probs: bool = False,
                 return_cum_log_probs: int = 0, memory_len: int = 0,
                 return_context_embeddings: bool = False, return_hidden_states: bool = False,
                 prompt_embeddings: torch.Tensor | None = None,
                 prompt_lengths: torch.Tensor | Sequence[int] | None = None,
                 inputs_embeds: torch.Tensor | None = None) -> GenerationOutput:
        """Generate ``max_new_tokens`` tokens per row (fewer when a row ends).

        Per-row arguments take a scalar (all rows) or a list of ``B`` values. FT's names in
        brackets (``docs/GENERATION_API.md`` has the engine's options).

        Args:
            input_ids: int tensor ``[B, S]`` (right padded; any device) or a list of ``B`` token
                lists of any lengths [input_ids]. Ids must be in ``[0, vocab_size)``.
            max_new_tokens: tokens to generate, >= 1 [output_len / request_output_len].
            input_lengths: with a tensor ``input_ids``: int ``[B]`` valid lengths (default ``S``)
                [input_lengths].
            do_sample: sample instead of greedy decoding (HF). FT has no switch: ``top_k=1``
                is greedy there; without ``do_sample`` we send ``top_k=1`` [runtime_top_k].
            top_k: with ``do_sample``: keep the ``k`` most likely tokens, 0 or None = no filter
                (HF's default is 50; ours is no filter), at most 1024 [runtime_top_k].
            top_p: with ``do_sample``: nucleus mass in (0, 1], None = 1 = off [runtime_top_p].
            temperature: > 0, divides the logits [temperature].
            repetition_penalty: > 0, 1 = off; logit < 0 ? logit * p : logit / p for every token
                seen in the prompt or output [repetition_penalty].
            presence_penalty: subtracted once from the logit of every seen token
                [presence_penalty].
            frequency_penalty: subtracted per occurrence of a seen token [frequency_penalty].
            min_length: ``end_id`` is banned until this many new tokens exist [min_length].
            num_beams: beam width 1..16; > 1 runs beam search (no sampling) [beam_width].
            length_penalty: beam score = cum_log_prob / generated_len ** length_penalty
                [len_penalty].
            diversity_rate: FT's beam diversity: a candidate's selection score drops by
                ``diversity_rate * rank`` within its parent beam [beam_search_diversity_rate].
            stop_words: ``[[ids...], ...]`` shared by all rows, or one such list per row; a row
                ends when its output ends with one (the word is kept) [stop_words_list].
            bad_words: same format; these token sequences are never completed
                [bad_words_list].
            end_id: end-of-sequence id(s), default the checkpoint's ``end_id`` [end_id].
            seed: per-row RNG seed(s) >= 0; same seed => same tokens whatever the batch. None
                with ``do_sample``: drawn from torch's global generator [random_seed].
            return_log_probs: also return per-token log probs [output_log_probs].
            return_cum_log_probs: FT's mode: 0 none, 1 generated tokens, 2 prompt + generated
                [return_cum_log_probs]; beam search always returns them.
            memory_len: > 0: every token (prompt and generated) attends only to its last
                ``memory_len`` positions, its own included, on top of the model's own sliding
                window; 0 = no window [memory_len]. ``max_seq_len`` still bounds the call (the
                cache is not reused as a ring).
            return_context_embeddings: also return the prompt's final hidden states
                (:attr:`GenerationOutput.context_embeddings`) [context_embeddings]; not in a
                session.
            return_hidden_states: also return the final hidden state each generated token was
                chosen from (:attr:`GenerationOutput.hidden_states`); ``num_beams`` must be 1.
            prompt_embeddings: float ``[B, P, E]`` (``E``: the word-embedding width) vectors
                that stand before each row's tokens in place of token embeddings (soft prompts,
                p-tuning) [request_prompt_embedding]; position embeddings and the embedding norm
                apply to them as to tokens. In ``sequences`` their positions hold the ids
                ``vocab_size + j`` (row-major over the rows' prompts).
            prompt_lengths: ``[B]`` rows of ``prompt_embeddings`` each row uses (default ``P``)
                [request_prompt_lengths].
            inputs_embeds: ``[B, S, E]``: the whole prompt as embeddings (HF's
                ``inputs_embeds``), instead of ``input_ids`` (pass ``input_ids=None``);
                ``prompt_lengths`` gives ragged rows.
        Returns:
            :class:`GenerationOutput`.
        """
        if inputs_embeds is not None:
            if input_ids is not None or prompt_embeddings is not None:
                raise ValueError("inputs_embeds replaces input_ids and prompt_embeddings: pass "
                                 "input_ids=None")
            prompt_embeddings = inputs_embeds
        elif input_ids is None:
            raise ValueError("input_ids is required (or inputs_embeds)")
        call = self._prepare(
            input_ids, max_new_tokens, input_lengths=input_lengths,
            do_sample=do_sample, top_k=top_k, top_p=top_p, temperature=temperature,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, min_length=min_length, num_beams=num_beams,
            length_penalty=length_penalty, diversity_rate=diversity_rate, stop_words=stop_words,
            bad_words=bad_words, end_id=end_id, seed=seed, return_log_probs=return_log_probs,
            return_cum_log_probs=return_cum_log_probs, memory_len=memory_len,
            prompt_embeddings=prompt_embeddings, prompt_lengths=prompt_lengths,
            return_context_embeddings=return_context_embeddings,
            return_hidden_states=return_hidden_states)
        return self._output(*call(self.engine))

    def _prepare(self, input_ids: IdsLike, max_new_tokens: int, *, input_lengths,
                 do_sample, top_k, top_p, temperature, repetition_penalty, presence_penalty,
                 frequency_penalty, min_length, num_beams, length_penalty, diversity_rate,
                 stop_words, bad_words, end_id, seed, return_log_probs, return_cum_log_probs,
                 memory_len=0, session=0, prompt_embeddings=None, prompt_lengths=None,
                 return_context_embeddings=False, return_hidden_states=False,
                 stacklevel: int = 4
                 ) -> Callable[[Any], tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Check one call's arguments (raising ``ValueError`` as :meth:`generate` does) and
        return the call itself: a function of an engine (this GPT's engine or one of its
        replicas) that queues the call on it and returns ``(result, lengths)`` for
        :meth:`_output`, the result's tensors on the device, written in the order of the current
        CUDA stream; nothing waits for the GPU. ``stacklevel``: of the option warnings, counted
        from :meth:`_options` to the user's frame."""
        _check_new_tokens(max_new_tokens)
        table = None
        if prompt_embeddings is not None:
            ids, lengths, table = prompt_inputs(self, input_ids, input_lengths, max_new_tokens,
                                                prompt_embeddings, prompt_lengths)
        elif prompt_lengths is not None:
            raise ValueError("prompt_lengths needs prompt_embeddings (or inputs_embeds)")
        else:
            ids, lengths = self._inputs(input_ids, input_lengths, max_new_tokens)
        # Default options (as plain Python values: anything else takes the general path and its
        # checks): the engine's greedy loop, without the per-row option arrays decode() parses
        # and sends (same tokens), and without building them here.
        num = lambda v, d: type(v) in (int, float) and v == d  # noqa: E731
        if (not do_sample and type(num_beams) is int and num_beams == 1
                and (top_k is None or (type(top_k) is int and top_k == 1))
                and (top_p is None or num(top_p, 1.0)) and num(temperature, 1.0)
                and num(repetition_penalty, 1.0) and num(presence_penalty, 0.0)
                and num(frequency_penalty, 0.0) and type(min_length) is int and min_length == 0
                and type(length_penalty) in (int, float) and type(diversity_rate) in (int, float)
                and stop_words is None and bad_words is None and seed is None
                and not return_log_probs and type(return_cum_log_probs) is int
                and return_cum_log_probs == 0 and (end_id is None or type(end_id) is int)
                and type(memory_len) is int and memory_len == 0 and session == 0
                and not return_context_embeddings and not return_hidden_states
                and table is None and not (end_id is None and len(self.end_ids) > 1)):
            end = -1 if end_id is None else int(self._checked(
                {"end_id": _tensor("end_id", end_id)}, ids.shape[0])["end_id"][0])

            def greedy(engine) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
                with torch.no_grad():
                    out_ids, seq = engine.generate(ids, lengths, max_new_tokens, end)
                return {"output_ids": out_ids, "sequence_lengths": seq}, lengths
            return greedy
        opts = self._options(
            ids.shape[0], max_new_tokens, do_sample=do_sample, top_k=top_k, top_p=top_p,
            temperature=temperature, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            min_length=min_length, num_beams=num_beams, length_penalty=length_penalty,
            diversity_rate=diversity_rate, stop_words=stop_words, bad_words=bad_words,
            end_id=end_id, seed=seed, return_log_probs=return_log_probs,
            return_cum_log_probs=return_cum_log_probs, memory_len=memory_len, session=session,
            prompt_table=table, return_context_embeddings=return_context_embeddings,
            return_hidden_states=return_hidden_states, stacklevel=stacklevel)

        def decode(engine) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
            with torch.no_grad():
                return engine.decode(ids, lengths, max_new_tokens, opts), lengths
        return decode

    def generate_batches(self, batches: Iterable[IdsLike | tuple[torch.Tensor, Any]],
                         max_new_tokens: int | Sequence[int], *, in_flight: int = 1,
                         **kwargs: Any) -> Iterator[GenerationOutput]:
        """:meth:`generate` over many batches, up to ``in_flight`` of them on the GPU at once;
        yields one :class:`GenerationOutput` per batch, in order.

        Small models leave most of the GPU idle during a decode step (a chain of short
        kernels), so one batch's prompt pass can run beside another's steps. With
        ``in_flight = N > 1`` the cuda backend keeps N engine instances over the same weight
        tensors, each on its own CUDA stream: batch ``i`` goes to instance ``i % N``, and the
        host waits for a batch's outputs only when its instance is needed again. The replicas
        are built on first use and kept; each adds its own KV cache, activations and GEMM
        workspace, and shares the engine's weights when the engine was given contiguous tensors
        of its dtype whose lm_head storage holds the padded vocabulary (what
        :meth:`from_pretrained` and :func:`warpformer.weights.load_weights` give); otherwise a
        replica converts its own copy, with a warning. A replica takes the engine's options
        (``engine.options()``). The tokens are those of :meth:`generate` batch by batch. The
        reference backend runs each batch as it is submitted (one at a time, on its one engine)
        and yields the outputs in the same order, ``in_flight`` batches behind.

        Args:
            batches: an iterable of batches, each what :meth:`generate` takes as ``input_ids``
                (a list of ``B`` token lists, or an int tensor ``[B, S]`` of full rows), or a
                pair ``(input_ids tensor [B, S], input_lengths int [B])`` for right-padded rows.
                CUDA tensors are read in the order of the caller's current stream.
            max_new_tokens: one count for every batch, or a sequence of one count per batch
                (exactly as many as there are batches).
            in_flight: batches on the GPU at once, >= 1; > 1 needs the cuda backend on one GPU
                (``tensor_para_size`` and ``pipeline_para_size`` 1).
            **kwargs: :meth:`generate`'s options (``do_sample``, ``top_k``, ``num_beams``, ...),
                the same for every batch.
        Yields:
            :class:`GenerationOutput` of each batch, in the order of ``batches``; its tensors
            are ready on the stream that was current when it was yielded.

        An argument error in batch ``i`` (its ``input_ids``, its options' values) or an error
        raised by ``batches`` itself comes after the outputs of the batches before it; argument
        errors name the batch (``batches[i]: ...``).
        """
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise ValueError(f"in_flight must be an integer >= 1, got {in_flight!r}")
        if in_flight > 1 and self.backend == "cuda":
            tp = int(self.engine.tensor_para_size())
            pp = int(self.engine.pipeline_para_size())
            for name, size in (("tensor_para_size", tp), ("pipeline_para_size", pp)):
                if size > 1:
                    raise ValueError(f"in_flight={in_flight} needs a model on one GPU; this one "
                                     f"has {name} {size} (use in_flight=1)")
        if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
            _check_new_tokens(int(max_new_tokens))
            counts: tuple[int, ...] | None = None
        elif isinstance(max_new_tokens, Sequence) and not isinstance(max_new_tokens, str):
            counts = tuple(max_new_tokens)
            for i, n in enumerate(counts):
                if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                    raise ValueError(f"max_new_tokens[{i}] must be an integer >= 1, got {n!r}")
            counts = tuple(int(n) for n in counts)
            if hasattr(batches, "__len__") and len(batches) != len(counts):
                raise ValueError(f"max_new_tokens has {len(counts)} values for "
                                 f"{len(batches)} batches")
        else:
            raise ValueError("max_new_tokens must be an integer >= 1 or a sequence of them, got "
                             f"{max_new_tokens!r}")
        return _in_flight.run(self, iter(batches),
                              int(max_new_tokens) if counts is None else counts, in_flight,
                              _option_kwargs(kwargs))

    # ------------------------------------------------------------------ sessions
    def start_session(self, batch: int, max_len: int) -> GenerationSession:
        """An interactive session of ``batch`` conversations whose KV caches stay on the GPU
        between turns (FT's interactive generation: ``session_len``, ``continue_gen``):
        :meth:`GenerationSession.generate` appends each turn's new tokens to the rows' histories
        and runs the prompt pass over them only. ``max_len`` bounds a row's history plus a
        turn's new tokens (at most ``max_seq_len``). Close it (or use ``with``) to free its
        rows of the cache."""
        from .session import GenerationSession
        return GenerationSession(self, batch, max_len)

    # ------------------------------------------------------------------ scoring
    def logits(self, input_ids: IdsLike,
               input_lengths: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Logits of every position: ``[B, S, V]`` (model dtype on cuda, fp32 on the reference;
        rows are zero past their length). ``input_ids``/``input_lengths`` as in
        :meth:`generate`."""
        ids, lengths = self._inputs(input_ids, input_lengths, 0)
        with torch.no_grad():
            return self.engine.forward(ids, lengths)

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT({c.model_variant}, layers={c.num_layer}, hidden={c.hidden_size}, "
                f"vocab={c.vocab_size}, backend={self.backend}, dtype={self.dtype}, "
                f"device={self.device})")

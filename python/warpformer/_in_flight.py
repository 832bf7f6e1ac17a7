"""The machinery behind :meth:`warpformer.GPT.generate_batches`: batches queued on up to N
engine instances of one model (the GPT's engine and replicas over its weight tensors), each
driven from its own CUDA stream, and their outputs handed back in order on the caller's stream
(``docs/ARCHITECTURE.md``, "Batches in flight"). The public method checks the arguments; this
module runs them.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .gpt import GPT, GenerationOutput, IdsLike


def engine_weights(engine: torch.ScriptObject) -> dict[str, torch.Tensor]:
    """The weights a ``torch.classes.warpformer.GptModel`` was given, by name: the very tensors
    (not copies), from its pickled state ``(config, weights, options)``. (Python's
    ``ScriptObject.__getstate__`` returns ``(state, class name)``.)"""
    state, _ = engine.__getstate__()
    return state[1]


def batch_item(item: Any) -> tuple[IdsLike, Any]:
    """(input_ids, input_lengths) of one of ``generate_batches``' batches."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], torch.Tensor):
        return item
    if isinstance(item, tuple) and item and isinstance(item[0], torch.Tensor):
        raise ValueError(f"a tensor batch is input_ids or (input_ids, input_lengths), got a "
                         f"tuple of {len(item)}")
    return item, None


def replica(gpt: GPT, index: int) -> torch.ScriptObject:
    """Replica ``index`` of ``gpt``'s engine (built on first use, then kept in
    ``gpt._replicas``): a second instance of the same model and limits over the engine's weight
    tensors. Warns when building it allocated more than 1% of the weights' bytes beyond its KV
    cache and workspace, i.e. when it converted weights of its own."""
    if index < len(gpt._replicas):
        return gpt._replicas[index]
    weights = engine_weights(gpt.engine)
    dev = torch.device("cuda", int(gpt.engine.device()))
    before = torch.cuda.memory_allocated(dev)
    made = torch.classes.warpformer.GptModel(gpt.engine.config(), weights, gpt.engine.options())
    copied = torch.cuda.memory_allocated(dev) - before - int(made.memory_bytes())
    weights = sum(t.nbytes for t in weights.values())
    if copied > 0.01 * weights:
        warnings.warn(
            f"warpformer: a generate_batches replica converted {copied / 2**20:.0f} MiB of "
            "weights of its own (the engine's weights are not contiguous tensors of its "
            "dtype, or its lm_head has no padding rows); pass weights as load_weights "
            "returns them to share them", stacklevel=4)
    gpt._replicas.append(made)
    return made


def run(gpt: GPT, items: Iterator, counts: int | tuple[int, ...], in_flight: int,
        opts: dict[str, Any]) -> Iterator[GenerationOutput]:
    """Yield ``gpt``'s output of every batch of ``items`` in order, ``in_flight`` of them
    queued: on the cuda backend each on instance ``i % in_flight`` and its stream, on the
    reference backend on its one engine as submitted. ``counts``: every batch's
    ``max_new_tokens``, or one per batch (checked); ``opts``: :meth:`GPT.generate`'s options.

    One host thread drives every instance. With the prompt pass replayed from a CUDA graph a
    bloom-560m LAMBADA batch costs ~0.2 ms of host time, so the host is no longer the bound, and
    at 4 in flight the wall nears the GPU's ~2.0 ms a batch (before prompt graphs the host was
    the bound from 3 in flight, at ~1.3 ms of launches a batch). Worker threads
    per instance were measured slower: the launches contend in the CUDA driver
    (``benchmarks/HISTORY.md``, "Measured and dropped: batches in flight from worker threads",
    "Prompt passes replayed from CUDA graphs")."""
    cuda = gpt.backend == "cuda"
    dev = torch.device("cuda", int(gpt.engine.device())) if cuda else None
    engines = [gpt.engine]
    streams: list[torch.cuda.Stream] = []
    pending: collections.deque[tuple[int, dict[str, torch.Tensor], torch.Tensor]] = (
        collections.deque())

    def collect() -> GenerationOutput:
        k, result, lengths = pending.popleft()
        if not cuda:
            return gpt._output(result, lengths)
        caller = torch.cuda.current_stream(dev)
        with torch.cuda.stream(streams[k]):
            out = gpt._output(result, lengths)
        caller.wait_stream(streams[k])
        for t in (out.sequences, out.sequence_lengths, out.input_lengths,
                  out.cum_log_probs, out.log_probs):
            if t is not None and t.is_cuda:
                t.record_stream(caller)  # made on streams[k], used on the caller's
        return out

    def submit(i: int, item: Any) -> None:
        k = i % in_flight
        n = counts if isinstance(counts, int) else counts[i]
        ids, lengths = batch_item(item)
        call = gpt._prepare(ids, n, input_lengths=lengths, stacklevel=5, **opts)
        if not cuda:
            pending.append((k, *call(gpt.engine)))
            return
        if k == len(engines):
            engines.append(replica(gpt, k - 1))
        while len(streams) <= k:
            streams.append(torch.cuda.Stream(device=dev))
        # The batch's inputs (and anything the caller made before it) come first.
        streams[k].wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(streams[k]):
            pending.append((k, *call(engines[k])))

    # An error stops the queue: the batches before it are still yielded, then it is raised
    # (argument errors of a batch named after it).
    i, error = 0, None
    try:
        while True:
            if len(pending) == in_flight:
                yield collect()
            try:
                item = next(items)
            except StopIteration:
                break
            except Exception as exc:  # the batches' source itself
                error = exc
                break
            if not isinstance(counts, int) and i >= len(counts):
                error = ValueError(f"max_new_tokens has {len(counts)} values but batches has "
                                   "more batches than that")
                break
            try:
                submit(i, item)
            except (ValueError, TypeError) as exc:
                error = type(exc)(f"batches[{i}]: {exc}")
                error.__cause__ = exc
                break
            except Exception as exc:  # the engine's call (a CUDA error, out of memory, ...)
                error = exc
                break
            i += 1
        while pending:
            try:
                out = collect()
            except BaseException:
                if error is None:
                    raise
                # The earlier outputs cannot be read (a CUDA error sticks to the context): the
                # first error is the one to report, with this one as its context.
                raise error  # noqa: B904
            yield out
        if error is not None:
            raise error
        if not isinstance(counts, int) and i != len(counts):
            raise ValueError(f"max_new_tokens has {len(counts)} values for {i} batches")
    finally:
        if cuda:  # a consumer that stops early leaves nothing running unseen
            caller = torch.cuda.current_stream(dev)
            for st in streams:
                caller.wait_stream(st)

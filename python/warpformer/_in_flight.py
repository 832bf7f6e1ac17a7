"""The machinery behind :meth:`warpformer.GPT.generate_batches`: batches queued on up to N
engine instances of one model (the GPT's engine and replicas over its weight tensors), each
driven from its own CUDA stream, and their outputs handed back in order on the caller's stream
(``docs/ARCHITECTURE.md``, "Batches in flight"). The public method checks the arguments; this
module runs them.
"""

from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .gpt import GPT, GenerationOutput, IdsLike


def engine_args(engine: torch.ScriptObject) -> tuple:
    """The constructor arguments of a ``torch.classes.warpformer.GptModel`` (config JSON,
    weights by name, max_batch, max_seq_len, dtype, tensor_para_rank, pipeline_para_size,
    pipeline_para_rank, gemm_config): its pickled state, the weights being the very tensors it
    was given (not copies), so a class built from them is a second instance of the same model
    and limits. (Python's ``ScriptObject.__getstate__`` returns ``(state, class name)``.)"""
    state, _ = engine.__getstate__()
    return tuple(state)


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
    args = engine_args(gpt.engine)
    dev = torch.device("cuda", int(gpt.engine.device()))
    before = torch.cuda.memory_allocated(dev)
    made = torch.classes.warpformer.GptModel(*args)
    copied = torch.cuda.memory_allocated(dev) - before - int(made.memory_bytes())
    weights = sum(t.nbytes for t in args[1].values())
    if copied > 0.01 * weights:
        warnings.warn(
            f"warpformer: a generate_batches replica converted {copied / 2**20:.0f} MiB of "
            "weights of its own (the engine's weights are not contiguous tensors of its "
            "dtype, or its lm_head has no padding rows); pass weights as load_weights "
            "returns them to share them", stacklevel=4)
    gpt._replicas.append(made)
    return made


def threads_enabled() -> bool:
    """Whether batches in flight on the cuda backend are driven from worker threads (one per
    engine instance); ``WARPFORMER_IN_FLIGHT_THREADS=0`` drives them all from the caller's
    thread instead (for A/B measurements; read per ``generate_batches`` call)."""
    return os.environ.get("WARPFORMER_IN_FLIGHT_THREADS") != "0"


def run(gpt: GPT, items: Iterator, counts: int | tuple[int, ...], in_flight: int,
        opts: dict[str, Any]) -> Iterator[GenerationOutput]:
    """Yield ``gpt``'s output of every batch of ``items`` in order, ``in_flight`` of them
    queued: on the cuda backend each on instance ``i % in_flight`` and its stream, on the
    reference backend on its one engine as submitted. ``counts``: every batch's
    ``max_new_tokens``, or one per batch (checked); ``opts``: :meth:`GPT.generate`'s options.

    The caller's thread checks each batch's arguments. With more than one instance (and
    :func:`threads_enabled`), instance ``k``'s engine calls and output conversions run on a
    worker thread of its own: the engine releases the GIL while it launches a batch's kernels
    (about 1 ms of host time for a LAMBADA-sized prompt pass, which one thread driving every
    instance made the bound), so the instances' launches proceed side by side."""
    cuda = gpt.backend == "cuda"
    dev = torch.device("cuda", int(gpt.engine.device())) if cuda else None
    workers = cuda and in_flight > 1 and threads_enabled()
    engines = [gpt.engine]
    streams: list[torch.cuda.Stream] = []
    pools: list[ThreadPoolExecutor] = []
    # Per queued batch: (instance, its call's result or the future of its output).
    pending: collections.deque[tuple[int, Any]] = collections.deque()

    def instance(k: int) -> None:
        """Instance ``k``'s engine, stream and (with workers) thread, made on first use. With
        workers every replica is built before the first batch is handed to a thread: building
        one measures the allocator (:func:`replica`), which running engines would disturb."""
        if k == len(engines):
            for j in range(len(engines), in_flight if workers else k + 1):
                engines.append(replica(gpt, j - 1))
        while len(streams) <= k:
            streams.append(torch.cuda.Stream(device=dev))
        while workers and len(pools) <= k:
            pools.append(ThreadPoolExecutor(1, thread_name_prefix=f"warpformer-in-flight-{k}"))

    def work(k: int, call: Any, ready: torch.cuda.Event) -> tuple[GenerationOutput,
                                                                  torch.cuda.Event]:
        """On instance ``k``'s thread: queue the call, wait for it, convert its outputs."""
        with torch.cuda.device(dev), torch.cuda.stream(streams[k]):
            streams[k].wait_event(ready)
            out = gpt._output(*call(engines[k]))
            done = torch.cuda.Event()
            done.record(streams[k])
        return out, done

    def collect() -> GenerationOutput:
        k, queued = pending.popleft()
        if not cuda:
            return gpt._output(*queued)
        caller = torch.cuda.current_stream(dev)
        if workers:
            out, done = queued.result()
            caller.wait_event(done)
        else:
            with torch.cuda.stream(streams[k]):
                out = gpt._output(*queued)
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
            pending.append((k, call(gpt.engine)))
            return
        instance(k)
        if workers:
            # The batch's inputs (and anything the caller made before it) come first.
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(dev))
            pending.append((k, pools[k].submit(work, k, call, ready)))
            return
        streams[k].wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(streams[k]):
            pending.append((k, call(engines[k])))

    # An error stops the queue: the batches before it are still yielded, then it is raised.
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
            i += 1
        while pending:
            yield collect()
        if error is not None:
            raise error
        if not isinstance(counts, int) and i != len(counts):
            raise ValueError(f"max_new_tokens has {len(counts)} values for {i} batches")
    finally:
        # A consumer that stops early, or an error, leaves nothing running unseen: the
        # threads' calls end (their errors, after the first, are dropped with their batches)
        # and the caller's stream is ordered after every instance's work.
        for pool in pools:
            pool.shutdown(wait=True)
        if cuda:
            caller = torch.cuda.current_stream(dev)
            for st in streams:
                caller.wait_stream(st)

"""Multi-GPU launch, rendezvous and failure handling: one process per GPU, NCCL between them.

warpformer runs tensor parallelism (TP) and pipeline parallelism (PP) with one process per GPU and
``rank = pp_rank * tensor_para_size + tp_rank``. This module finds each process's rank and GPU,
makes every rank agree that its checkpoint loaded before any NCCL call, exchanges the NCCL unique
ids and creates the communicators (``torch.classes.warpformer.NcclComm``). It needs a stock
PyTorch wheel: no MPI-enabled PyTorch build and no ``torch.distributed`` process group.

Launching::

    mpirun -n 2 python examples/generate.py --tensor_para_size 2 ...        # OpenMPI / MPICH
    torchrun --nproc-per-node 2 examples/generate.py --tensor_para_size 2 ...
    srun -n 4 --gpus-per-task 1 python examples/generate.py --tensor_para_size 4 ...

In a script::

    ctx = warpformer.distributed.init(tensor_para_size=2)   # or setup(), load, check, connect()
    ctx.tp_comm.all_reduce_(t)
    warpformer.distributed.print0("only rank 0 prints this")
    ctx.shutdown()

``GPT.from_pretrained(..., tensor_para_size=2)`` calls :func:`load_gpt_model`, which does it all.

Environment read (explicit arguments win over all of it; the first launcher found is used):

- torchrun (when ``TORCHELASTIC_RUN_ID`` is set, it is the innermost launcher): ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; ``MASTER_ADDR``/``MASTER_PORT``, the
  agent's store (``TORCHELASTIC_USE_AGENT_STORE``) and ``TORCHELASTIC_RESTART_COUNT``.
- OpenMPI: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
  ``OMPI_COMM_WORLD_LOCAL_SIZE``.
- MPICH / Intel MPI / Hydra (PMI): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
  ``MPI_LOCALNRANKS``.
- Slurm ``srun``: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``),
  ``SLURM_LOCALID``.
- ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` without torchrun (hand-made launches).
- ``WARPFORMER_RENDEZVOUS``: ``auto`` (default), ``mpi`` or ``store`` forces the id transport.
- ``WARPFORMER_MPI_ABORT_ON_ERROR``: ``1`` (default) makes an uncaught exception under MPI call
  ``MPI_Abort``, so a failed rank ends the whole job instead of leaving peers in ``MPI_Finalize``.

Rendezvous (how the ranks talk before NCCL exists), first that applies: an explicit
``init_method="tcp://host:port"`` (rank 0 hosts a ``TCPStore`` there); mpi4py point-to-point
messages on ``MPI.COMM_WORLD`` when launched by MPI and ``mpi4py`` imports (``pip install mpi4py``;
any MPI library, PyTorch itself needs none); a ``torch.distributed.TCPStore`` at
``MASTER_ADDR:MASTER_PORT`` (torchrun's agent hosts it, else rank 0 does). Every wait polls with
a deadline: nothing blocks forever.

GPU choice: ``local_rank`` indexes the visible GPUs; a process that sees exactly one GPU (Slurm
``--gpus-per-task 1``, a wrapper setting ``CUDA_VISIBLE_DEVICES``) uses it.

Failure behaviour (every rank raises, within the stated time, and never enters NCCL):

- world size != tp * pp, tp or pp < 1, an inconsistent rank: ``ValueError`` from
  :func:`discover`, identical on every rank, immediately.
- a rank without a GPU, more ranks on a host than GPUs, two ranks on one GPU, ranks asking for
  different tp/pp: ``ValueError`` on every rank naming the rank(s) and host(s), from the preflight
  check in :func:`setup` (as soon as all ranks have started; ``timeout_s`` at most).
- a rank fails while loading weights, or loaded a checkpoint converted for another
  ``tensor_para_size`` or another model: ``RuntimeError`` on every rank naming the rank(s) and
  their messages, from :func:`checkpoint_barrier`, as soon as every rank has reported.
- a rank that never reports (crashed, hung): ``RuntimeError`` naming it after ``timeout_s``.
- NCCL initialisation that does not complete: the C++ ``NcclComm`` aborts it after ``timeout_s``
  and raises ``RuntimeError`` naming the rank and group size.

A rank that raises ends its process; ``torchrun`` and ``mpirun`` then stop the remaining ranks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import _rendezvous as _rdv
from ._agreement import _CHECKPOINT_KEYS as _CHECKPOINT_KEYS
from ._agreement import (
    _agree,
    _checkpoint_problems,
    _failures,
    _group_lines,
    _next_seq,
    _ranges,
    describe_checkpoint,
)
from ._agreement import _Report as _Report
from ._launch import _ENV_LAUNCHERS as _ENV_LAUNCHERS
from ._launch import RankInfo, _from_env, _locate, _with_device
from ._launch import _check_grid as _check_grid
from ._launch import _env_int as _env_int
from ._rendezvous import Rendezvous
from .options import EngineOptions

__all__ = [
    "RankInfo",
    "DistContext",
    "Rendezvous",
    "discover",
    "rendezvous",
    "exchange_id",
    "checkpoint_barrier",
    "describe_checkpoint",
    "setup",
    "init",
    "get_context",
    "load_gpt_model",
    "print0",
]

# Layout: launcher environment discovery and RankInfo are in ``_launch``, the cross-rank reports
# and failure messages in ``_agreement``, the pre-NCCL transports (and the choice among them) in
# ``_rendezvous``; their private names stay importable from here, as read-only aliases (to
# replace one, patch it in the module that defines it). This module keeps the public
# API, the process's current context, and the hooks tests replace on this module
# (``_cuda_device_count``, ``_device_uuid``, ``_nccl_unique_id``, ``_new_comm``) together with
# every function that calls them, so that patching ``warpformer.distributed.<hook>`` takes effect.


# ---------------------------------------------------------------------------------- devices
def _cuda_device_count() -> int:
    return torch.cuda.device_count()


def _device_uuid(device: int) -> str:
    props = torch.cuda.get_device_properties(device)
    return str(getattr(props, "uuid", f"{props.name}#{device}"))


def _pick_device(info: RankInfo) -> int:
    """This rank's CUDA index; ValueError naming the rank and host when it has none."""
    device, problem = _device_or_problem(info)
    if problem is not None:
        raise ValueError(f"{info.where()}: {problem}")
    return device


def _device_or_problem(info: RankInfo) -> tuple[int, str | None]:
    """(CUDA index, None) or (-1, why this rank cannot have one).

    ``local_rank`` indexes the visible GPUs. One visible GPU per process (Slurm
    ``--gpus-per-task``, a wrapper setting ``CUDA_VISIBLE_DEVICES``) means device 0; two ranks
    landing on one GPU that way are caught by the preflight check, which compares GPU UUIDs.
    """
    count = _cuda_device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if count == 0:
        return -1, (f"no CUDA device visible (torch.cuda.device_count() == 0, "
                    f"CUDA_VISIBLE_DEVICES={visible!r}); every rank needs one GPU")
    if count == 1:
        return 0, None
    if info.local_rank >= count:
        ranks = (f"{info.local_world_size} local ranks" if info.local_world_size
                 else f"local rank {info.local_rank}")
        return -1, (f"more local ranks than GPUs on host {info.host}: {ranks} but {count} "
                    f"visible GPUs (CUDA_VISIBLE_DEVICES={visible!r}); start at most {count} "
                    "ranks per host")
    return info.local_rank, None


def discover(tensor_para_size: int = 1, pipeline_para_size: int = 1, *, rank: int | None = None,
             world_size: int | None = None, local_rank: int | None = None) -> RankInfo:
    """This process's place in the TP x PP grid and its GPU, from the launcher's environment or
    the explicit ``rank``/``world_size``/``local_rank`` (which win over the environment).

    Raises ValueError naming the values and the rule when ``world_size != tp * pp``, tp or pp is
    below 1, the rank is outside the world, no CUDA device is visible to this rank, or this host
    has more local ranks than GPUs. Nothing here talks to other ranks or to NCCL.
    """
    info = _locate(tensor_para_size, pipeline_para_size, rank, world_size, local_rank)
    return _with_device(info, _pick_device(info))


# ---------------------------------------------------------------------------------- rendezvous
_generation = 0


def rendezvous(info: RankInfo, *, init_method: str | None = None,
               timeout_s: float = 300.0) -> Rendezvous:
    """Open the pre-NCCL transport for ``info``'s world (every rank calls this once per
    :func:`setup`; the n-th call on each rank meets the n-th call on the others).

    ``init_method``: ``"tcp://host:port"`` (rank 0 hosts a TCPStore there), ``"env://"``
    (``MASTER_ADDR``/``MASTER_PORT``), ``"mpi"`` (mpi4py) or None (automatic: mpi4py when
    launched by MPI and it imports, else ``MASTER_ADDR``/``MASTER_PORT``).
    """
    global _generation
    _generation += 1
    return _rdv.open_rendezvous(info.rank, info.world_size, info.launcher,
                                init_method=init_method, timeout_s=timeout_s,
                                prefix=f"warpformer/{_generation}")


def _default_rendezvous(info: RankInfo, given: Rendezvous | None) -> Rendezvous:
    if given is not None:
        return given
    ctx = _CURRENT
    if ctx is not None and ctx.info.rank == info.rank and ctx.info.world_size == info.world_size:
        return ctx.rendezvous
    if info.world_size == 1:
        return _rdv.LocalRendezvous()
    raise RuntimeError("no rendezvous: call warpformer.distributed.setup()/init() first or pass "
                       "rendezvous=warpformer.distributed.rendezvous(info)")


def exchange_id(info: RankInfo, group_ranks: Sequence[int], key: str,
                make_id: Callable[[], bytes | torch.Tensor], *,
                rendezvous: Rendezvous | None = None, timeout_s: float = 300.0) -> bytes:
    """The group's first rank calls ``make_id()``; every member gets its bytes.

    Args:
        info: this rank (must be in ``group_ranks``).
        group_ranks: global ranks of the group; ``group_ranks[0]`` makes the id.
        key: a name unique per exchange (e.g. ``"nccl/tp/0"``).
        make_id: returns ``bytes`` or a uint8 CPU tensor (``nccl_unique_id()``: [128]).
    Raises RuntimeError if the id does not arrive within ``timeout_s``.
    """
    ranks = [int(r) for r in group_ranks]
    if info.rank not in ranks:
        raise ValueError(f"rank {info.rank} is not in group_ranks {ranks}")
    root = ranks[0]
    if info.rank == root:
        value = make_id()
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        value = bytes(value)
        if len(ranks) > 1:
            _default_rendezvous(info, rendezvous).put(key, value, ranks[1:])
        return value
    transport = _default_rendezvous(info, rendezvous)
    got = transport.wait_all(key, [root], time.monotonic() + timeout_s)
    if root not in got:
        raise RuntimeError(
            f"rank {info.rank}: no id for group {ranks} ({key!r}) from rank {root} within "
            f"{timeout_s:g} s over the {transport.description}; rank {root} crashed, hung or "
            "failed earlier: see its log")
    return got[root]


# ---------------------------------------------------------------------------------- barriers
def checkpoint_barrier(info: RankInfo, status_ok: bool, message: str = "",
                       timeout_s: float = 300.0, *, checkpoint: dict[str, Any] | None = None,
                       rendezvous: Rendezvous | None = None, what: str = "loading weights"
                       ) -> None:
    """Every rank reports whether loading its weights succeeded (and, optionally, which
    checkpoint it loaded, see :func:`describe_checkpoint`); returns only if all ranks succeeded
    and loaded the same model converted for ``info.tensor_para_size``.

    Otherwise every rank raises the same RuntimeError naming the failed ranks and their
    messages, ranks that did not report within ``timeout_s``, and checkpoint mismatches. Call
    it between weight loading and NCCL initialisation. Returns as soon as all ranks have
    reported; waits ``timeout_s`` at most for missing ones. ``what`` names the phase in the
    message (``"loading weights"``).
    """
    transport = _default_rendezvous(info, rendezvous)
    key = f"barrier/{_next_seq(transport)}/{what}"
    reports = _agree(info, transport, key, status_ok, message, checkpoint, timeout_s)
    failures = _failures(info, reports, timeout_s)
    lines = []
    if failures:
        lines.append(f"{len(failures)} of {info.world_size} ranks failed while {what}:")
        lines.extend(_group_lines(failures))
    mismatch = _checkpoint_problems(info, reports)
    if mismatch:
        lines.append("checkpoint mismatch:")
        lines.extend(mismatch)
    if lines:
        when = "before NCCL starts" if what == "loading weights" else "with this error"
        raise RuntimeError(f"warpformer.distributed, {info.where()}: " + "\n".join(lines)
                           + f"\nEvery rank stops here, {when}.")


def _preflight(info: RankInfo, transport: Rendezvous, device_error: str | None,
               timeout_s: float) -> None:
    """All ranks compare their view of the grid and their GPUs; ValueError on every rank."""
    extra = {"tp": info.tensor_para_size, "pp": info.pipeline_para_size, "device": info.device,
             "uuid": _device_uuid(info.device) if device_error is None else None}
    reports = _agree(info, transport, "preflight", device_error is None, device_error or "",
                     extra, timeout_s)
    failures = _failures(info, reports, timeout_s)
    grids = {r: (rep.extra["tp"], rep.extra["pp"]) for r, rep in reports.items() if rep.extra}
    if len(set(grids.values())) > 1:
        for r, (tp, pp) in grids.items():
            failures.setdefault(r, (reports[r].host, f"asked for tensor_para_size {tp}, "
                                                     f"pipeline_para_size {pp}"))
    users: dict[tuple[str, str], list[int]] = {}
    for r, rep in sorted(reports.items()):
        if rep.ok and rep.extra and rep.extra.get("uuid"):
            users.setdefault((rep.host, rep.extra["uuid"]), []).append(r)
    for (host, uuid), ranks in users.items():
        if len(ranks) > 1:
            for r in ranks:
                failures.setdefault(
                    r, (host, f"shares GPU {uuid} with ranks {_ranges(ranks)}: more local ranks "
                              "than GPUs (one GPU per rank)"))
    if failures:
        raise ValueError(
            f"warpformer.distributed, {info.where()}: {len(failures)} of {info.world_size} "
            "ranks cannot start:\n" + "\n".join(_group_lines(failures))
            + "\nEvery rank stops here, before NCCL starts.")


# ---------------------------------------------------------------------------------- context
def _nccl_unique_id() -> torch.Tensor:
    return torch.ops.warpformer.nccl_unique_id()


def _new_comm(unique_id: torch.Tensor, size: int, rank: int, device: int,
              timeout_s: float, peer_allreduce: bool = True) -> Any:
    return torch.classes.warpformer.NcclComm(unique_id, size, rank, device, timeout_s,
                                             peer_allreduce)


@dataclass
class DistContext:
    """This rank's distributed state: where it sits, the pre-NCCL rendezvous and the NCCL
    communicators (``tp_comm``/``pp_comm``; None for groups of size 1 or before
    :meth:`connect`)."""

    info: RankInfo
    rendezvous: Rendezvous
    timeout_s: float = 300.0
    tp_comm: Any = None
    pp_comm: Any = None
    connected: bool = False
    peer_allreduce: bool = True

    @property
    def is_output_rank(self) -> bool:
        """Rank 0: the one that prints and writes results."""
        return self.info.rank == 0

    def check(self, status_ok: bool, message: str = "", *,
              checkpoint: dict[str, Any] | None = None, what: str = "loading weights") -> None:
        """:func:`checkpoint_barrier` over this context's rendezvous."""
        checkpoint_barrier(self.info, status_ok, message, self.timeout_s, checkpoint=checkpoint,
                           rendezvous=self.rendezvous, what=what)

    def barrier(self, timeout_s: float | None = None) -> None:
        """Wait for every rank (over the rendezvous, not NCCL); RuntimeError naming the ranks
        that did not arrive within ``timeout_s`` (default: the context's)."""
        checkpoint_barrier(self.info, True, "", self.timeout_s if timeout_s is None else timeout_s,
                           rendezvous=self.rendezvous, what="waiting at a barrier")

    def connect(self, peer_allreduce: bool = True) -> DistContext:
        """Exchange NCCL unique ids (TP group, then PP group) and create the communicators;
        ``peer_allreduce``: offer the one-shot NVLink all-reduce (EngineOptions). The groups of a
        process are made once: a later call asking for the other choice is refused."""
        if self.connected:
            if peer_allreduce != self.peer_allreduce:
                raise ValueError(f"peer_allreduce={peer_allreduce}, but this process's NCCL "
                                 f"groups were made with peer_allreduce={self.peer_allreduce}")
            return self
        info, comms = self.info, {}
        try:
            for name, ranks, group_rank in (("tp", info.tp_group, info.tp_rank),
                                            ("pp", info.pp_group, info.pp_rank)):
                if len(ranks) == 1:
                    continue
                uid = exchange_id(info, ranks, f"nccl/{name}/{ranks[0]}", _nccl_unique_id,
                                  rendezvous=self.rendezvous, timeout_s=self.timeout_s)
                tensor = torch.frombuffer(bytearray(uid), dtype=torch.uint8).clone()
                comms[name] = _new_comm(tensor, len(ranks), group_rank, info.device,
                                        self.timeout_s, peer_allreduce)
        except BaseException:
            for comm in comms.values():
                comm.abort()
            raise
        self.tp_comm, self.pp_comm = comms.get("tp"), comms.get("pp")
        self.peer_allreduce = peer_allreduce
        self.connected = True
        return self

    def shutdown(self) -> None:
        """Abort the communicators (engines using them cannot run afterwards) and close the
        rendezvous. Safe to call twice."""
        global _CURRENT
        for comm in (self.tp_comm, self.pp_comm):
            if comm is not None:
                comm.abort()
        self.tp_comm = self.pp_comm = None
        self.connected = False
        self.rendezvous.close()
        if _CURRENT is self:
            _CURRENT = None

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


_CURRENT: DistContext | None = None


def get_context() -> DistContext | None:
    """The context made by the last :func:`setup`/:func:`init` of this process, if any."""
    return _CURRENT


def setup(tensor_para_size: int = 1, pipeline_para_size: int = 1, *, timeout_s: float = 300.0,
          rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
          init_method: str | None = None) -> DistContext:
    """Discover the rank, pick and set its GPU, open the rendezvous and run the preflight
    check (every rank has a GPU of its own and asks for the same grid) — no NCCL yet.

    Load the weights next, report with :meth:`DistContext.check`, then :meth:`DistContext.connect`.
    """
    global _CURRENT
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    info = _locate(tensor_para_size, pipeline_para_size, rank, world_size, local_rank)
    device, device_error = _device_or_problem(info)
    if device_error is not None and info.world_size == 1:
        raise ValueError(f"{info.where()}: {device_error}")
    info = _with_device(info, device)
    transport = rendezvous(info, init_method=init_method, timeout_s=timeout_s)
    try:
        if info.world_size > 1:
            _preflight(info, transport, device_error, timeout_s)
        torch.cuda.set_device(info.device)
    except BaseException:
        transport.close()
        raise
    _CURRENT = DistContext(info, transport, timeout_s)
    return _CURRENT


def init(tensor_para_size: int = 1, pipeline_para_size: int = 1, *, timeout_s: float = 300.0,
         rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
         init_method: str | None = None, peer_allreduce: bool = True) -> DistContext:
    """:func:`setup` then :meth:`DistContext.connect`: the rank's context with its NCCL
    communicators ready (``tp_comm`` among ranks with the same ``pp_rank``, ``pp_comm`` among
    ranks with the same ``tp_rank``; ``peer_allreduce``: the EngineOptions keyword)."""
    ctx = setup(tensor_para_size, pipeline_para_size, timeout_s=timeout_s, rank=rank,
                world_size=world_size, local_rank=local_rank, init_method=init_method)
    try:
        return ctx.connect(peer_allreduce)
    except BaseException:
        ctx.shutdown()
        raise


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only (flushes by default)."""
    if _CURRENT is not None:
        rank = _CURRENT.info.rank
    else:
        found = _from_env()
        rank = found[1] if found else 0
    if rank == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def load_gpt_model(model_dir: str | os.PathLike[str], *, dtype: torch.dtype = torch.float16,
                   tensor_para_size: int = 1, pipeline_para_size: int = 1, max_batch: int = 8,
                   max_seq_len: int | None = None, options: EngineOptions | None = None,
                   timeout_s: float = 300.0, init_method: str | None = None) -> Any:
    """Load this rank's shards of a converted directory into ``GptModel`` with NCCL attached.

    Order: :func:`setup` (reusing the current context if it has the same grid), read
    ``config.ini``, load this rank's weights and build the engine, :func:`checkpoint_barrier`
    (any rank's failure or a checkpoint converted for another tp stops every rank here), then
    :meth:`DistContext.connect` and ``attach_tensor_parallel`` / ``attach_pipeline_parallel``.
    """
    from .models.gpt import build_gpt_model
    from .weights import load_weights, read_config, resolve_model_dir

    ctx = _CURRENT
    if ctx is None or (ctx.info.tensor_para_size, ctx.info.pipeline_para_size) != (
            tensor_para_size, pipeline_para_size):
        ctx = setup(tensor_para_size, pipeline_para_size, timeout_s=timeout_s,
                    init_method=init_method)
    info = ctx.info
    engine, summary, ok, message = None, None, True, ""
    try:
        path = resolve_model_dir(model_dir)
        config = read_config(path)
        summary = describe_checkpoint(config, path)
        if config.tensor_para_size == tensor_para_size:  # else the barrier reports the mismatch
            weights = load_weights(path, tp_rank=info.tp_rank, pp_rank=info.pp_rank,
                                   pipeline_para_size=pipeline_para_size, dtype=dtype,
                                   device=f"cuda:{info.device}")
            engine = build_gpt_model(config, weights, dtype=dtype, max_batch=max_batch,
                                     max_seq_len=max_seq_len, tensor_para_rank=info.tp_rank,
                                     pipeline_para_size=pipeline_para_size,
                                     pipeline_para_rank=info.pp_rank, options=options)
            del weights
    except Exception as exc:  # noqa: BLE001 - reported to every rank by the barrier
        ok, message = False, f"{type(exc).__name__}: {exc}"
    ctx.check(ok, message, checkpoint=summary)
    ctx.connect(peer_allreduce=(options or EngineOptions()).peer_allreduce)
    if ctx.tp_comm is not None:
        engine.attach_tensor_parallel(ctx.tp_comm)
    if ctx.pp_comm is not None:
        engine.attach_pipeline_parallel(ctx.pp_comm)
    return engine

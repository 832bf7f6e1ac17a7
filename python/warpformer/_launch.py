"""Launcher environment discovery for :mod:`warpformer.distributed`: :class:`RankInfo` (where a
process sits in the TP x PP grid) and how it is read from the launcher's variables (torchrun,
OpenMPI, MPICH/PMI, Slurm, hand-set ``RANK``/``WORLD_SIZE``) or explicit arguments.

Nothing here looks at GPUs or talks to other ranks: the device is chosen, and the ranks compared,
in :mod:`warpformer.distributed`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the TP x PP grid (``rank = pp_rank * tp + tp_rank``)."""

    rank: int
    world_size: int
    local_rank: int
    tensor_para_size: int
    pipeline_para_size: int
    tp_rank: int
    pp_rank: int
    device: int
    """Local CUDA device index this rank uses (-1 before a device is chosen)."""
    launcher: str
    """``"mpirun"`` (OpenMPI, MPICH/PMI), ``"torchrun"``, ``"slurm"`` (srun), ``"env"``
    (``RANK``/``WORLD_SIZE`` set by hand), ``"explicit"`` (arguments) or ``"single"``."""
    local_world_size: int | None = None
    host: str = field(default_factory=socket.gethostname)

    @property
    def tp_group(self) -> list[int]:
        """Global ranks of this rank's TP group (same ``pp_rank``), in ``tp_rank`` order."""
        tp = self.tensor_para_size
        return [self.pp_rank * tp + t for t in range(tp)]

    @property
    def pp_group(self) -> list[int]:
        """Global ranks of this rank's PP group (same ``tp_rank``), in ``pp_rank`` order."""
        tp = self.tensor_para_size
        return [p * tp + self.tp_rank for p in range(self.pipeline_para_size)]

    @property
    def is_output_rank(self) -> bool:
        """Rank 0: the one that prints and writes results."""
        return self.rank == 0

    def where(self) -> str:
        """How messages name this rank: rank, world size, host, tp_rank and pp_rank."""
        return (f"rank {self.rank} of {self.world_size} (host {self.host}, tp_rank "
                f"{self.tp_rank}, pp_rank {self.pp_rank})")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


# (launcher, rank var, size var, local rank var, local size var); tried in this order.
_ENV_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpirun", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)


def _from_env() -> tuple[str, int, int, int | None, int | None, str] | None:
    """(launcher, rank, world size, local rank, local world size, variables) from the first
    launcher whose variables are set, or None."""
    for launcher, rank_var, size_var, local_var, local_size_var in _ENV_LAUNCHERS:
        if launcher == "torchrun" and "TORCHELASTIC_RUN_ID" not in os.environ:
            continue
        rank, size = _env_int(rank_var), _env_int(size_var)
        if rank is None or size is None:
            continue
        local = _env_int(local_var)
        local_size = _env_int(local_size_var) if local_size_var else None
        return launcher, rank, size, local, local_size, f"{rank_var}/{size_var}"
    return None


def _check_grid(tp: Any, pp: Any) -> None:
    for name, value in (("tensor_para_size", tp), ("pipeline_para_size", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _locate(tp: int, pp: int, rank: int | None, world_size: int | None,
            local_rank: int | None) -> RankInfo:
    """RankInfo without a device (``device = -1``); errors depend only on values all ranks share
    (the grid and world size), so every rank raises the same one."""
    _check_grid(tp, pp)
    local_size = None
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("explicit rank and world_size go together: got "
                             f"rank={rank!r}, world_size={world_size!r}")
        launcher, source = "explicit", "rank=/world_size= arguments"
        local = rank if local_rank is None else local_rank
    else:
        found = _from_env()
        if found is None:
            launcher, rank, world_size, local, source = "single", 0, 1, 0, "no launcher found"
        else:
            launcher, rank, world_size, local, local_size, source = found
            if local_rank is not None:
                local = local_rank
            if local is None:  # hand-made launch on one host
                local = rank
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank ({rank}) must be in [0, world_size ({world_size})) "
                         f"(from {source})")
    if local < 0:
        raise ValueError(f"local_rank must be >= 0, got {local} (from {source})")
    if world_size != tp * pp:
        hint = ("start the script with a launcher (mpirun -n N / torchrun --nproc-per-node N)"
                if launcher == "single" else "start exactly tp * pp processes, one per GPU")
        raise ValueError(
            f"world size {world_size} (from {source}) must equal tensor_para_size {tp} x "
            f"pipeline_para_size {pp} = {tp * pp}: {hint}")
    return RankInfo(rank=rank, world_size=world_size, local_rank=local, tensor_para_size=tp,
                    pipeline_para_size=pp, tp_rank=rank % tp, pp_rank=rank // tp, device=-1,
                    launcher=launcher, local_world_size=local_size)


def _with_device(info: RankInfo, device: int) -> RankInfo:
    fields = {k: getattr(info, k) for k in info.__dataclass_fields__}
    fields["device"] = device
    return RankInfo(**fields)

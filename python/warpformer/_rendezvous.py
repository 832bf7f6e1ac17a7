"""Pre-NCCL transports of :mod:`warpformer.distributed`: how ranks exchange small values
(NCCL unique ids, load status) before any communicator exists.

Three kinds, all polled with deadlines so that no wait is unbounded: a dict (one process),
mpi4py point-to-point messages on ``MPI.COMM_WORLD`` (under mpirun), and a ``torch.distributed``
``TCPStore`` (torchrun, or ``MASTER_ADDR``/``MASTER_PORT``, or ``init_method="tcp://h:p"``).
:func:`open_rendezvous` picks one for a rank from ``init_method`` and the environment.
"""

from __future__ import annotations

import abc
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

POLL_S = 0.02
LINGER_MAX_S = 30.0
_MPI_TAG = 0x5746  # "WF"; MPI guarantees tags up to 32767


class Rendezvous(abc.ABC):
    """Pre-NCCL messaging between ranks: write-once values, read by polling with deadlines.

    ``put(key, value, readers)`` publishes ``value`` under ``(this rank, key)`` for ``readers``;
    ``try_get(key, writer)`` returns ``writer``'s value or None if it has not arrived yet.
    Keys must be unique within one rendezvous.
    """

    description = "rendezvous"

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @abc.abstractmethod
    def put(self, key: str, value: bytes, readers: Sequence[int]) -> None:
        """Publish ``value`` under ``(this rank, key)`` for ``readers``."""

    @abc.abstractmethod
    def try_get(self, key: str, writer: int) -> bytes | None:
        """``writer``'s value for ``key``, or None if it has not arrived yet."""

    def linger(self, key: str, count: int, deadline: float) -> None:  # noqa: B027 (optional hook)
        """Announce that this rank is done with ``key``; the rank keeping the transport alive
        waits (until ``deadline``) for ``count`` ranks to say so before it may leave."""

    def close(self) -> None:  # noqa: B027 (optional hook: nothing to release by default)
        """Release the transport (the host waits briefly so that peers finish first)."""

    def wait_all(self, key: str, writers: Sequence[int], deadline: float) -> dict[int, bytes]:
        """Values of ``writers`` under ``key`` that arrived before ``deadline``."""
        got: dict[int, bytes] = {}
        pending = list(writers)
        while True:
            for writer in list(pending):
                value = self.try_get(key, writer)
                if value is not None:
                    got[writer] = value
                    pending.remove(writer)
            if not pending or time.monotonic() >= deadline:
                return got
            time.sleep(POLL_S)


class LocalRendezvous(Rendezvous):
    """World size 1: values go to a dict."""

    description = "single process"

    def __init__(self) -> None:
        super().__init__(0, 1)
        self._values: dict[str, bytes] = {}

    def put(self, key, value, readers):
        self._values[key] = value

    def try_get(self, key, writer):
        return self._values.get(key)


class StoreRendezvous(Rendezvous):
    """A ``torch.distributed.TCPStore``: rank 0 hosts it (or torchrun's agent does)."""

    def __init__(self, rank: int, world_size: int, host: str, port: int, timeout_s: float,
                 *, agent_store: bool = False, prefix: str = "warpformer") -> None:
        super().__init__(rank, world_size)
        from torch.distributed import TCPStore

        if not 0 < port < 65536:
            raise ValueError(f"rendezvous port must be in [1, 65535], got {port}")
        self.address = f"{host}:{port}"
        self.hosting = rank == 0 and not agent_store
        owner = "torchrun's agent" if agent_store else "rank 0"
        self.description = f"TCPStore at {self.address} (hosted by {owner})"
        self._prefix = prefix
        self._timeout_s = timeout_s
        try:
            self._store = TCPStore(host, port, world_size=None, is_master=self.hosting,
                                   timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                                   multi_tenant=True)
        except Exception as exc:  # noqa: BLE001 - re-raised with the address and the rank
            if self.hosting:
                raise RuntimeError(
                    f"rank 0 could not host the rendezvous store on {self.address} ({exc}); "
                    "choose a free MASTER_PORT / init_method port") from exc
            raise RuntimeError(
                f"rank {rank} could not reach the rendezvous store at {self.address} within "
                f"{timeout_s:g} s ({exc}); is {owner} running, and is MASTER_ADDR/init_method "
                "reachable from this host?") from exc

    def _key(self, key: str, writer: int) -> str:
        return f"{self._prefix}/{key}@{writer}"

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the store's own errors name no rank
            raise RuntimeError(
                f"rank {self.rank} lost the rendezvous {self.description} while {what} ({exc}); "
                "the hosting rank has probably exited: see its error") from exc

    def put(self, key, value, readers):
        self._call(f"writing {key!r}", self._store.set, self._key(key, self.rank), value)

    def try_get(self, key, writer):
        full = self._key(key, writer)
        if not self._call(f"waiting for {key!r}", self._store.check, [full]):
            return None
        return bytes(self._call(f"reading {key!r}", self._store.get, full))

    def linger(self, key, count, deadline):
        counter = f"{self._prefix}/{key}/left"
        if not self.hosting:
            try:
                self._store.add(counter, 1)
            except Exception:  # noqa: BLE001 - the host has left already; we have our answer
                pass
            return
        self._call(f"leaving {key!r}", self._store.add, counter, 1)
        while time.monotonic() < deadline:
            if self._call(f"leaving {key!r}", self._store.add, counter, 0) >= count:
                return
            time.sleep(POLL_S)

    def close(self):
        if getattr(self, "_store", None) is None:
            return
        try:
            grace = min(self._timeout_s, LINGER_MAX_S)
            self.linger("close", self.world_size, time.monotonic() + grace)
        except RuntimeError:
            pass  # a peer's connection broke: nothing left to wait for
        self._store = None


class MpiRendezvous(Rendezvous):
    """mpi4py point-to-point messages on ``MPI.COMM_WORLD`` (polled, so waits have deadlines)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        if self._comm.Get_size() != world_size or self._comm.Get_rank() != rank:
            raise RuntimeError(
                f"MPI.COMM_WORLD has rank {self._comm.Get_rank()} of {self._comm.Get_size()}, "
                f"but the environment says rank {rank} of {world_size}")
        self.description = f"MPI ({MPI.Get_library_version().splitlines()[0].strip()})"
        self._mailbox: dict[tuple[int, str], bytes] = {}
        self._sends: list[Any] = []
        install_mpi_abort_hook(self._comm)

    def put(self, key, value, readers):
        for reader in readers:
            if reader == self.rank:
                self._mailbox[(reader, key)] = value
            else:
                self._sends.append(self._comm.isend((key, value), dest=reader, tag=_MPI_TAG))
        self._sends = [req for req in self._sends if not req.Test()]

    def try_get(self, key, writer):
        status = self._mpi.Status()
        while self._comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_MPI_TAG, status=status):
            source = status.Get_source()
            got_key, value = self._comm.recv(source=source, tag=_MPI_TAG)
            self._mailbox[(source, got_key)] = value
        return self._mailbox.pop((writer, key), None)

    def close(self):
        deadline = time.monotonic() + LINGER_MAX_S
        while self._sends and time.monotonic() < deadline:
            self._sends = [req for req in self._sends if not req.Test()]
            time.sleep(POLL_S)


def install_mpi_abort_hook(comm: Any) -> None:
    """An uncaught exception ends the MPI job (MPI_Abort) instead of leaving the other ranks, or
    this one in MPI_Finalize, waiting forever. ``WARPFORMER_MPI_ABORT_ON_ERROR=0`` disables."""
    if os.environ.get("WARPFORMER_MPI_ABORT_ON_ERROR", "1") == "0":
        return
    previous = sys.excepthook
    if getattr(previous, "_warpformer_mpi_abort", False):
        return

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)

    hook._warpformer_mpi_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def mpi_launched() -> bool:
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def store_from_env(rank: int, world_size: int, launcher: str, timeout_s: float,
                   prefix: str) -> StoreRendezvous | None:
    """A store at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent's when it serves there), or
    None when those are not set."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    if not port.strip().isdigit():
        raise ValueError(f"environment variable MASTER_PORT must be an integer, got {port!r}")
    agent = launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if agent:
        prefix = f"{prefix}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return StoreRendezvous(rank, world_size, host, int(port), timeout_s, agent_store=agent,
                           prefix=prefix)


def open_rendezvous(rank: int, world_size: int, launcher: str, *, init_method: str | None,
                    timeout_s: float, prefix: str) -> Rendezvous:
    """The transport for one rank of ``world_size`` (``launcher`` as in ``RankInfo.launcher``),
    chosen as :func:`warpformer.distributed.rendezvous` documents: a dict for one process, else
    ``init_method`` (``"tcp://host:port"``, ``"env://"``, ``"mpi"`` or None for automatic),
    ``WARPFORMER_RENDEZVOUS`` and the launcher's variables. Store keys start with ``prefix``.

    Raises ValueError for a malformed ``init_method``/``WARPFORMER_RENDEZVOUS`` or when no
    transport applies, RuntimeError when MPI was required but is unavailable.
    """
    if world_size == 1:
        return LocalRendezvous()
    forced = os.environ.get("WARPFORMER_RENDEZVOUS", "auto").strip().lower()
    if forced not in ("auto", "mpi", "store"):
        raise ValueError(f"WARPFORMER_RENDEZVOUS must be auto, mpi or store, got {forced!r}")
    if init_method is not None and init_method not in ("env://", "mpi"):
        if not init_method.startswith("tcp://"):
            raise ValueError(f"init_method must be 'tcp://host:port', 'env://' or 'mpi', "
                             f"got {init_method!r}")
        host, _, port = init_method[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"init_method must be 'tcp://host:port', got {init_method!r}")
        return StoreRendezvous(rank, world_size, host.strip("[]"), int(port), timeout_s,
                               prefix=prefix)
    want_mpi = init_method == "mpi" or forced == "mpi" or (
        init_method is None and forced == "auto" and mpi_launched())
    mpi_error = None
    if want_mpi:
        try:
            return MpiRendezvous(rank, world_size)
        except (ImportError, RuntimeError) as exc:
            if init_method == "mpi" or forced == "mpi":
                raise RuntimeError(f"rank {rank}: MPI rendezvous unavailable: {exc}") from exc
            mpi_error = exc
    store = store_from_env(rank, world_size, launcher, timeout_s, prefix)
    if store is not None:
        return store
    why = f" (mpi4py: {mpi_error})" if mpi_error else ""
    raise ValueError(
        f"rank {rank} of {world_size} (launcher {launcher}) has no rendezvous"
        f"{why}: install mpi4py when launching with mpirun, use torchrun, or set MASTER_ADDR and "
        "MASTER_PORT (or pass init_method='tcp://host:port') on every rank")

"""One rank of a multi-process warpformer.distributed test (started by mpirun, torchrun or the
tests with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set).

With ``--mock-gpu`` (CPU tests) the GPU and NCCL are simulated: 4 visible devices per process (0
on ``--no-gpu-rank``), a fake NCCL id naming the rank that made it, and a communicator object that
records its group. Without it the real ``torch.classes.warpformer.NcclComm`` is used and each
communicator is checked with an all-reduce.

Prints one line ``RESULT {json}`` and exits 0, or prints ``ERROR {json}`` and re-raises the error
(uncaught, as in a user's script).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import warpformer.distributed as dist


class FakeComm:
    def __init__(self, unique_id: torch.Tensor, size: int, rank: int, device: int,
                 timeout_s: float, peer_allreduce: bool = True) -> None:
        self.uid = bytes(unique_id.numpy().tobytes()).rstrip(b"\0").decode()
        self._size, self._rank, self.device = size, rank, device
        self.aborted = False

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def abort(self) -> None:
        self.aborted = True


def mock_gpu(rank: int, no_gpu_rank: int, same_gpu: bool) -> None:
    dist._cuda_device_count = lambda: 0 if rank == no_gpu_rank else 4
    dist._device_uuid = lambda device: f"GPU-fake-{0 if same_gpu else rank}"
    torch.cuda.set_device = lambda device: None
    dist._nccl_unique_id = lambda: torch.tensor(
        list(f"id-of-rank-{rank}-pid-{os.getpid()}".encode().ljust(128, b"\0")), dtype=torch.uint8)
    dist._new_comm = FakeComm


def describe(comm) -> dict | None:
    if comm is None:
        return None
    out = {"rank": comm.rank(), "size": comm.size()}
    if isinstance(comm, FakeComm):
        out["uid"] = comm.uid
    else:  # real NCCL: sum of (global rank + 1) over the group
        t = torch.full((1024,), float(dist.get_context().info.rank + 1), device="cuda")
        comm.all_reduce_(t)
        torch.cuda.synchronize()
        out["sum"] = float(t[0].item())
        out["uniform"] = bool((t == t[0]).all().item())
    return out


SCENARIOS = ("ok", "init", "fail", "hang", "ckpt_tp", "ckpt_model", "no_gpu", "same_gpu",
             "exit_before_nccl", "allreduce", "peer_dead")

# Element counts for the all-reduce checks: partial vectors, one block, several blocks, the
# largest peer message in fp16 (1 MiB) and one NCCL takes over (2 MiB in fp32).
ALLREDUCE_COUNTS = (1, 7, 8, 1000, 4096, 65536 + 3, 262144, 524288)
ALLREDUCE_ATOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def _rank_data(count: int, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(count * 131 + rank * 7 + salt * 1009)
    return torch.randn(count, generator=g).to(dtype)


def _rank_order_sum(count: int, dtype: torch.dtype, ranks: int, salt: int = 0) -> torch.Tensor:
    """What the peer all-reduce computes: fp32 sum in rank order, rounded once."""
    acc = torch.zeros(count)
    for r in range(ranks):
        acc += _rank_data(count, dtype, r, salt).float()
    return acc.to(dtype)


def check_all_reduce(comm) -> dict:
    """Sums over ``comm`` of several sizes and dtypes by every path, eager, as one NCCL group
    (and the group's refusals), back to back without host syncs, and replayed from a CUDA
    graph, against the fp32 rank-order sum (bit-exact on the peer path, within NCCL's rounding
    otherwise). Returns what failed and a digest of the results (equal on every rank when all
    ranks computed the same bits)."""
    me, n = comm.rank(), comm.size()
    peer = comm.peer_all_reduce()
    bad: list[str] = []
    digest = 0

    def check(got: torch.Tensor, want: torch.Tensor, exact: bool, what: str) -> None:
        nonlocal digest
        got = got.cpu()
        digest = (digest * 31 + int(got.float().sum().double().item() * 1e6)) % (1 << 61)
        if exact and not torch.equal(got, want):
            bad.append(f"{what}: not bit-equal, max diff "
                       f"{float((got.float() - want.float()).abs().max()):.3g}")
        elif not torch.allclose(got.float(), want.float(), rtol=0,
                                atol=ALLREDUCE_ATOL[want.dtype] * n):
            bad.append(f"{what}: max diff {float((got.float() - want.float()).abs().max()):.3g}")

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for count in ALLREDUCE_COUNTS:
            fits = count * torch.finfo(dtype).bits // 8 <= 1 << 20
            for path in ("auto", "nccl") + (("peer",) if peer and fits else ()):
                x = _rank_data(count, dtype, me).cuda()
                comm.all_reduce_(x, path)
                exact = path == "peer" or (path == "auto" and peer and fits)
                check(x, _rank_order_sum(count, dtype, n), exact, f"{dtype} {count} {path}")
    if peer:  # a message that does not fit is refused by the explicit peer path
        try:
            comm.all_reduce_(torch.zeros(600000, device="cuda"), "peer")
            bad.append("a 2.4 MB message was accepted by path 'peer'")
        except RuntimeError as e:
            if "at most" not in str(e):
                bad.append(f"unexpected error for an oversized peer message: {e}")

    # One NCCL group of several sums (mixed sizes and dtypes), issued together.
    group = [(1000, torch.float32), (4096, torch.float16), (77 * 8, torch.bfloat16),
             (262144, torch.float16)]
    xs = [_rank_data(c, dt, me, salt=200 + i).cuda() for i, (c, dt) in enumerate(group)]
    back = comm.all_reduce_group_(xs, "auto")
    same = [b.data_ptr() for b in back] == [x.data_ptr() for x in xs]
    if not same:
        bad.append("all_reduce_group_ did not return its tensors, summed in place")
    for i, ((c, dt), x) in enumerate(zip(group, xs, strict=True)):
        check(x, _rank_order_sum(c, dt, n, salt=200 + i), False, f"group member {i} {dt} {c}")
    # The peer path cannot join a group: refused inside it, after which the group must be
    # closed (an open one would swallow the next call, which would then never run).
    try:
        comm.all_reduce_group_([torch.ones(8, device="cuda")], "peer")
        bad.append("path 'peer' was accepted inside a group")
    except RuntimeError as e:
        if "cannot join a group" not in str(e):
            bad.append(f"unexpected error for 'peer' inside a group: {e}")
    try:
        comm.all_reduce_group_([torch.ones(8, device="cuda"), torch.ones(8)], "auto")
        bad.append("a CPU tensor was accepted by all_reduce_group_")
    except RuntimeError as e:
        if "ts[1]" not in str(e):
            bad.append(f"the error for a CPU tensor does not name ts[1]: {e}")
    x = _rank_data(2048, torch.float16, me, salt=250).cuda()
    comm.all_reduce_(x, "nccl")
    check(x, _rank_order_sum(2048, torch.float16, n, salt=250), False, "call after a failed group")

    # Back to back: no host synchronisation, alternating sizes, so fast ranks run ahead.
    counts = [4096, 262144, 1000] * 20
    xs = [_rank_data(c, torch.float16, me, salt=i).cuda() for i, c in enumerate(counts)]
    for x in xs:
        comm.all_reduce_(x)
    for i, (c, x) in enumerate(zip(counts, xs, strict=True)):
        check(x, _rank_order_sum(c, torch.float16, n, salt=i), peer, f"back-to-back call {i}")

    # Captured once, replayed with new data: the call counter advances inside the graph.
    x = torch.zeros(3000, dtype=torch.float16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        comm.all_reduce_(x)
    for i in range(20):
        x.copy_(_rank_data(3000, torch.float16, me, salt=100 + i).cuda())
        graph.replay()
        check(x, _rank_order_sum(3000, torch.float16, n, salt=100 + i), peer, f"replay {i}")
    torch.cuda.synchronize()
    return {"peer": peer, "reason": comm.peer_all_reduce_reason(), "bad": bad,
            "digest": str(digest)}


def run(scenario: str = "ok", tp: int = 1, pp: int = 1, timeout: float = 30.0,
        bad_rank: int = -1, hang_s: float = 0.0, init_method: str | None = None,
        mock: bool = True, no_peer_rank: int = -1) -> dict | None:
    """Play one rank of ``scenario``; returns what this rank saw (None for the hung rank) or
    raises what warpformer.distributed raised."""
    found = dist._from_env()
    rank = found[1] if found else 0
    if mock:
        mock_gpu(rank, bad_rank if scenario == "no_gpu" else -1, scenario == "same_gpu")
    bad = rank == bad_rank
    if scenario in ("allreduce", "peer_dead"):
        ctx = dist.init(tp, pp, timeout_s=timeout, init_method=init_method,
                        peer_allreduce=rank != no_peer_rank)
        if scenario == "allreduce":
            result = {"rank": rank, **check_all_reduce(ctx.tp_comm)}
            ctx.shutdown()
            return result
        if bad:
            os._exit(0)  # gone without a word, after the group was set up
        x = torch.ones(1024, device="cuda")
        ctx.tp_comm.all_reduce_(x, "peer")  # waits for the dead rank, then traps
        torch.cuda.synchronize()
        return {"rank": rank, "unexpected": "the all-reduce completed"}
    if scenario == "init":
        ctx = dist.init(tp, pp, timeout_s=timeout, init_method=init_method)
        result = {"rank": rank, "tp": describe(ctx.tp_comm), "pp": describe(ctx.pp_comm)}
        ctx.shutdown()
        return result
    ctx = dist.setup(tp, pp, timeout_s=timeout, init_method=init_method)
    if scenario == "hang" and bad:
        time.sleep(hang_s)  # "loading" forever: never reports, then just goes away
        return None
    ok, message = True, ""
    ckpt = {"tensor_para_size": tp, "model_name": "gpt2", "model_variant": "gpt2",
            "num_layer": 4, "head_num": 4, "size_per_head": 64, "inter_size": 1024,
            "vocab_size": 1000, "weight_data_type": "fp16", "path": f"/ckpt/{tp}-gpu"}
    if bad and scenario == "fail":
        ok, message = False, f"WeightFileError: missing weight file model.wte.bin (rank {rank})"
    if bad and scenario == "ckpt_tp":
        ckpt = dict(ckpt, tensor_para_size=4, path="/ckpt/4-gpu")
    if bad and scenario == "ckpt_model":
        ckpt = dict(ckpt, num_layer=8)
    ctx.check(ok, message, checkpoint=ckpt)
    if scenario == "exit_before_nccl" and bad:
        os._exit(1)  # dies between the barrier and NCCL initialisation
    ctx.connect()
    result = {"rank": rank, "info": {k: getattr(ctx.info, k) for k in (
        "rank", "world_size", "local_rank", "tp_rank", "pp_rank", "device", "launcher")},
        "rendezvous": type(ctx.rendezvous).__name__, "via": ctx.rendezvous.description,
        "tp": describe(ctx.tp_comm), "pp": describe(ctx.pp_comm)}
    ctx.barrier()
    ctx.shutdown()
    return result


class FakeEngine:
    """Stands in for torch.classes.warpformer.GptModel: records what it was built with."""

    def __init__(self, config, weights, **kwargs) -> None:
        self.config, self.weights, self.kwargs = config, weights, kwargs
        self.comms = (None, None)

    def attach_tensor_parallel(self, tp) -> None:
        self.comms = (tp, self.comms[1])

    def attach_pipeline_parallel(self, pp) -> None:
        self.comms = (self.comms[0], pp)


def run_load(model_dir: str, tp: int = 1, pp: int = 1, timeout: float = 30.0) -> dict:
    """``warpformer.distributed.load_gpt_model`` on CPU: real config and shard files, weights
    read to CPU, a FakeEngine instead of the CUDA one, simulated GPUs and NCCL."""
    import warpformer.models.gpt as gpt_models
    import warpformer.weights as weights

    found = dist._from_env()
    mock_gpu(found[1] if found else 0, -1, False)
    real_load = weights.load_weights
    weights.load_weights = lambda *a, **k: real_load(*a, **dict(k, device="cpu"))
    gpt_models.build_gpt_model = FakeEngine
    engine = dist.load_gpt_model(model_dir, dtype=torch.float32, tensor_para_size=tp,
                                 pipeline_para_size=pp, timeout_s=timeout)
    tp_comm, pp_comm = engine.comms
    out = {"kwargs": engine.kwargs, "names": sorted(engine.weights),
           "tp": describe(tp_comm), "pp": describe(pp_comm)}
    dist.get_context().shutdown()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--scenario", default="ok", choices=SCENARIOS)
    p.add_argument("--bad-rank", type=int, default=-1)
    p.add_argument("--hang-s", type=float, default=0.0, help="how long the hung rank sleeps")
    p.add_argument("--init-method", default=None)
    p.add_argument("--mock-gpu", action="store_true")
    p.add_argument("--no-peer-rank", type=int, default=-1,
                   help="the rank that creates its groups with peer_allreduce=False")
    args = p.parse_args()
    found = dist._from_env()
    start = time.monotonic()
    try:
        result = run(args.scenario, args.tp, args.pp, args.timeout, args.bad_rank, args.hang_s,
                     args.init_method, args.mock_gpu, args.no_peer_rank)
    except Exception as exc:
        emit("ERROR", {"rank": found[1] if found else 0, "type": type(exc).__name__,
                       "message": str(exc), "elapsed": time.monotonic() - start})
        raise  # uncaught, as in a user's script: exit code 1 (MPI_Abort under mpirun)
    emit("RESULT", result)
    return 0


def emit(tag: str, payload: dict) -> None:
    """Writes the line "TAG {json}" to stdout in one write call. The ranks share the launcher's
    stdout pipe, and print() may issue the text and its newline as two writes, between which
    another rank's line can land (seen in CI: "RESULT {...}RESULT {...}"); a single write of at
    most PIPE_BUF bytes to a pipe is never interleaved."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"{tag} {json.dumps(payload)}\n".encode())


if __name__ == "__main__":
    sys.exit(main())

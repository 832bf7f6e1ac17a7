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
                 timeout_s: float) -> None:
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
             "exit_before_nccl")


def run(scenario: str = "ok", tp: int = 1, pp: int = 1, timeout: float = 30.0,
        bad_rank: int = -1, hang_s: float = 0.0, init_method: str | None = None,
        mock: bool = True) -> dict | None:
    """Play one rank of ``scenario``; returns what this rank saw (None for the hung rank) or
    raises what warpformer.distributed raised."""
    found = dist._from_env()
    rank = found[1] if found else 0
    if mock:
        mock_gpu(rank, bad_rank if scenario == "no_gpu" else -1, scenario == "same_gpu")
    bad = rank == bad_rank
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
    args = p.parse_args()
    found = dist._from_env()
    start = time.monotonic()
    try:
        result = run(args.scenario, args.tp, args.pp, args.timeout, args.bad_rank, args.hang_s,
                     args.init_method, args.mock_gpu)
    except Exception as exc:
        print("ERROR " + json.dumps({"rank": found[1] if found else 0,
                                     "type": type(exc).__name__, "message": str(exc),
                                     "elapsed": time.monotonic() - start}), flush=True)
        raise  # uncaught, as in a user's script: exit code 1 (MPI_Abort under mpirun)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

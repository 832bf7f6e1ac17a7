"""warpformer.distributed on real GPUs (2 or more; run on nvidia-h200-x2 / -x4): ``init()`` under
torchrun, NCCL all-reduce sums over the TP and PP groups, the one-shot peer (NVLink) all-reduce
against the rank-order sum, and the failure scenarios ending every process in bounded time.
Independent of the engine (its TP/PP parity tests live elsewhere).

Each test starts tests/_dist_worker.py (one process per GPU) with torchrun, or by hand with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT when one rank needs its own environment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA devices"),
]

HERE = Path(__file__).resolve().parent.parent
WORKER = str(HERE / "_dist_worker.py")
NGPU = torch.cuda.device_count()
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(extra)
    return env


def _lines(text: str, tag: str) -> list[dict]:
    # Ranks print concurrently: two results can share a line, so split on the tag itself.
    text = text.replace(tag + " ", "\n" + tag + " ")
    return [json.loads(line[len(tag) + 1:]) for line in text.splitlines()
            if line.startswith(tag + " ")]


def _torchrun(nproc: int, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess,
                                                                       float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", WORKER, *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=_clean_env(), cwd=HERE.parent)
    return proc, time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by_hand(world: int, args: list[str], per_rank_env: dict[int, dict[str, str]] | None = None,
             wait_s: float = 120) -> tuple[dict[int, tuple[int, str]], float]:
    """Start ``world`` ranks without a launcher; all must end within ``wait_s`` (else killed and
    the test fails). Returns {rank: (exit code, stdout + stderr)} and the wall time."""
    port = _free_port()
    procs = []
    start = time.monotonic()
    for r in range(world):
        env = _clean_env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.update((per_rank_env or {}).get(r, {}))
        procs.append(subprocess.Popen([sys.executable, WORKER, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=HERE.parent))
    out, hung = {}, []
    try:
        for r, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=max(1.0, wait_s - (time.monotonic() - start)))
                out[r] = (p.returncode, text)
            except subprocess.TimeoutExpired:
                hung.append(r)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert not hung, f"ranks {hung} still running after {wait_s} s"
    return out, time.monotonic() - start


def _grids() -> list[tuple[int, int]]:
    grids = [(2, 1), (1, 2)]
    if NGPU >= 4:
        grids += [(4, 1), (2, 2), (1, 4)]
    return grids


@pytest.mark.parametrize("tp,pp", _grids())
def test_init_and_all_reduce(tp, pp):
    proc, _ = _torchrun(tp * pp, "--scenario", "init", "--tp", str(tp), "--pp", str(pp),
                        "--timeout", "120")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = {r["rank"]: r for r in _lines(proc.stdout, "RESULT")}
    assert sorted(results) == list(range(tp * pp))
    for rank, res in results.items():
        tp_rank, pp_rank = rank % tp, rank // tp
        tp_group = [pp_rank * tp + t for t in range(tp)]
        pp_group = [p * tp + tp_rank for p in range(pp)]
        for name, group, group_rank in (("tp", tp_group, tp_rank), ("pp", pp_group, pp_rank)):
            comm = res[name]
            if len(group) == 1:
                assert comm is None
                continue
            assert (comm["rank"], comm["size"]) == (group_rank, len(group))
            assert comm["sum"] == sum(r + 1 for r in group) and comm["uniform"]


def test_checkpoint_barrier_then_connect():
    proc, _ = _torchrun(2, "--scenario", "ok", "--tp", "2", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = _lines(proc.stdout, "RESULT")
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["tp"]["sum"] == 3.0 for r in results)


def test_failing_rank_ends_every_process():
    proc, seconds = _torchrun(2, "--scenario", "fail", "--tp", "2", "--bad-rank", "1",
                              "--timeout", "120")
    assert proc.returncode != 0 and seconds < 120
    errors = _lines(proc.stdout, "ERROR")
    assert errors and all("rank 1" in e["message"] and "WeightFileError" in e["message"]
                          for e in errors)
    assert all(e["elapsed"] < 60 for e in errors)


def test_rank_that_never_reports_ends_in_bounded_time():
    out, seconds = _by_hand(2, ["--scenario", "hang", "--tp", "2", "--bad-rank", "1",
                                "--hang-s", "20", "--timeout", "10"], wait_s=90)
    code, text = out[0]
    assert code != 0 and "rank 1: did not report within 10 s" in text, text[-4000:]


def test_rank_without_gpu_stops_every_rank():
    out, _ = _by_hand(2, ["--scenario", "ok", "--tp", "2", "--timeout", "60"],
                      per_rank_env={1: {"CUDA_VISIBLE_DEVICES": ""}}, wait_s=120)
    for rank, (code, text) in out.items():
        assert code != 0, f"rank {rank}: {text[-4000:]}"
        assert "rank 1" in text and "no CUDA device visible" in text, text[-4000:]


def test_rank_dying_before_nccl_init_times_out():
    # rank 1 exits after the checkpoint barrier; rank 0 made the id and waits in NCCL init,
    # which the C++ NcclComm aborts after timeout_s with an error naming the rank and size
    out, seconds = _by_hand(2, ["--scenario", "exit_before_nccl", "--tp", "2", "--bad-rank",
                                "1", "--timeout", "15"], wait_s=120)
    code, text = out[0]
    assert code != 0, text[-4000:]
    assert "ERROR" in text and seconds < 100


@pytest.mark.parametrize("tp", [2] + ([4] if NGPU >= 4 else []))
def test_peer_all_reduce_matches_rank_order_sum(tp):
    proc, _ = _torchrun(tp, "--scenario", "allreduce", "--tp", str(tp), "--timeout", "120")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = _lines(proc.stdout, "RESULT")
    assert sorted(r["rank"] for r in results) == list(range(tp))
    for r in results:
        assert r["peer"], f"rank {r['rank']}: no peer all-reduce: {r['reason']}"
        assert not r["bad"], f"rank {r['rank']}: {r['bad'][:10]}"
    assert len({r["digest"] for r in results}) == 1, "ranks computed different sums"


def test_peer_all_reduce_off_on_one_rank_is_off_everywhere():
    # The ranks decide together: one rank opting out gives NCCL on all, with correct sums.
    out, _ = _by_hand(2, ["--scenario", "allreduce", "--tp", "2", "--timeout", "60",
                          "--no-peer-rank", "1"], wait_s=180)
    for rank, (code, text) in out.items():
        assert code == 0, f"rank {rank}: {text[-4000:]}"
        (res,) = _lines(text, "RESULT")
        assert not res["peer"] and not res["bad"], res
        assert "peer_allreduce=False" in res["reason"] or "rank 1" in res["reason"], res


def test_peer_all_reduce_with_dead_peer_ends_in_bounded_time():
    # rank 1 exits after set-up; rank 0's kernel waits timeout_s for its signal, then traps, and
    # the process fails instead of spinning forever.
    out, seconds = _by_hand(2, ["--scenario", "peer_dead", "--tp", "2", "--bad-rank", "1",
                                "--timeout", "5"], wait_s=90)
    code, text = out[0]
    assert code != 0 and "the all-reduce completed" not in text, text[-4000:]
    assert "ERROR" in text and seconds < 90, text[-4000:]
    print(text[-2000:])

"""warpformer.distributed on CPU: rank discovery from each launcher's environment, and the
rendezvous, NCCL-id exchange and failure barriers across real processes on localhost (GPUs and
NCCL simulated by tests/_dist_worker.py). The mpirun tests need ``mpirun`` and ``mpi4py``
(apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py) and skip without them.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import warpformer.distributed as dist

pytest_plugins = ["_convert_fixtures"]

HERE = Path(__file__).resolve().parent
HOST = socket.gethostname()
sys.path.insert(0, str(HERE))
import _dist_worker  # noqa: E402

LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
    "WARPFORMER_RENDEZVOUS",
)


@pytest.fixture
def env(monkeypatch):
    """A clean launcher environment and 4 fake GPUs; returns a setter for variables."""
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dist, "_cuda_device_count", lambda: 4)

    def set_env(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, str(v))

    return set_env


# ---------------------------------------------------------------------------------- discovery
def test_single_process_needs_nothing(env):
    info = dist.discover()
    assert (info.rank, info.world_size, info.local_rank, info.device) == (0, 1, 0, 0)
    assert (info.tp_rank, info.pp_rank, info.launcher) == (0, 0, "single")
    assert info.tp_group == [0] and info.pp_group == [0] and info.is_output_rank


def test_openmpi(env):
    env(OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=1,
        OMPI_COMM_WORLD_LOCAL_SIZE=2)
    info = dist.discover(2, 2)
    assert (info.rank, info.world_size, info.local_rank, info.device) == (3, 4, 1, 1)
    assert (info.tp_rank, info.pp_rank, info.launcher) == (1, 1, "mpirun")
    assert info.local_world_size == 2
    assert info.tp_group == [2, 3] and info.pp_group == [1, 3]


def test_mpich_pmi(env):
    env(PMI_RANK=1, PMI_SIZE=2, MPI_LOCALRANKID=1)
    info = dist.discover(2)
    assert (info.rank, info.world_size, info.device, info.launcher) == (1, 2, 1, "mpirun")


def test_slurm_prefers_the_step_size(env):
    env(SLURM_PROCID=2, SLURM_NTASKS=4, SLURM_LOCALID=0)
    info = dist.discover(4)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (2, 4, 0, "slurm")
    # an allocation of 8 tasks running a 4-task srun step
    env(SLURM_NTASKS=8, SLURM_STEP_NUM_TASKS=4)
    assert dist.discover(2, 2).world_size == 4


def test_torchrun(env):
    env(TORCHELASTIC_RUN_ID="abc", RANK=2, WORLD_SIZE=4, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2)
    info = dist.discover(4)
    assert (info.rank, info.local_rank, info.device, info.launcher) == (2, 0, 0, "torchrun")


def test_plain_rank_variables(env):
    env(RANK=1, WORLD_SIZE=2)
    info = dist.discover(1, 2)
    assert (info.rank, info.local_rank, info.pp_rank, info.launcher) == (1, 1, 1, "env")


def test_precedence(env):
    env(SLURM_PROCID=0, SLURM_NTASKS=1, SLURM_LOCALID=0)
    env(PMI_RANK=1, PMI_SIZE=2)
    assert dist.discover(2).rank == 1  # PMI over Slurm (mpirun inside an allocation)
    env(OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=0)
    assert dist.discover(2).rank == 0  # OpenMPI over PMI
    env(RANK=1, WORLD_SIZE=2)
    assert dist.discover(2).launcher == "mpirun"  # stray RANK without torchrun loses
    env(TORCHELASTIC_RUN_ID="x", LOCAL_RANK=1)
    assert dist.discover(2).launcher == "torchrun"  # torchrun is the innermost launcher
    info = dist.discover(2, rank=0, world_size=2, local_rank=3)  # arguments win
    assert (info.rank, info.local_rank, info.device, info.launcher) == (0, 3, 3, "explicit")


def test_explicit_local_rank_overrides_env(env):
    env(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=1)
    assert dist.discover(2, local_rank=2).device == 2


def test_world_size_must_be_tp_times_pp(env):
    env(OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=4)
    with pytest.raises(ValueError, match=r"world size 4 .*tensor_para_size 3 x "
                                         r"pipeline_para_size 1 = 3"):
        dist.discover(3)
    with pytest.raises(ValueError, match="world size 1 .* tensor_para_size 2 .*exactly tp"):
        dist.discover(2, rank=0, world_size=1)


def test_parallel_grid_without_a_launcher(env):
    with pytest.raises(ValueError, match=r"world size 1 \(from no launcher found\) must equal "
                                         r"tensor_para_size 2 .*mpirun -n N"):
        dist.discover(2)


@pytest.mark.parametrize("tp,pp", [(0, 1), (1, 0), (-2, 1), (1.5, 1), (True, 1)])
def test_grid_must_be_positive_integers(env, tp, pp):
    with pytest.raises(ValueError, match="para_size must be an integer >= 1"):
        dist.discover(tp, pp)


def test_inconsistent_rank_values(env):
    with pytest.raises(ValueError, match="rank and world_size go together"):
        dist.discover(rank=1)
    with pytest.raises(ValueError, match=r"rank \(2\) must be in \[0, world_size \(2\)\)"):
        dist.discover(2, rank=2, world_size=2)
    env(OMPI_COMM_WORLD_RANK="one", OMPI_COMM_WORLD_SIZE=2)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK must be an integer"):
        dist.discover(2)


def test_no_gpu_names_rank_and_host(env, monkeypatch):
    monkeypatch.setattr(dist, "_cuda_device_count", lambda: 0)
    env(RANK=1, WORLD_SIZE=2)
    with pytest.raises(ValueError) as err:
        dist.discover(2)
    msg = str(err.value)
    assert "rank 1" in msg and socket.gethostname() in msg and "no CUDA device" in msg


def test_more_local_ranks_than_gpus(env, monkeypatch):
    monkeypatch.setattr(dist, "_cuda_device_count", lambda: 2)
    env(OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=3,
        OMPI_COMM_WORLD_LOCAL_SIZE=4)
    with pytest.raises(ValueError, match="more local ranks than GPUs .*4 local ranks but 2"):
        dist.discover(4)


def test_one_visible_gpu_per_process_is_device_0(env, monkeypatch):
    monkeypatch.setattr(dist, "_cuda_device_count", lambda: 1)
    env(SLURM_PROCID=3, SLURM_NTASKS=4, SLURM_LOCALID=3)
    assert dist.discover(4).device == 0


# ---------------------------------------------------------------------------------- one process
def test_single_process_context(env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    made = []
    monkeypatch.setattr(dist, "_nccl_unique_id", lambda: made.append(1))
    with dist.init() as ctx:
        assert ctx.is_output_rank and ctx.tp_comm is None and ctx.pp_comm is None
        assert dist.get_context() is ctx
        ctx.barrier()
        ctx.check(True, "", checkpoint={"tensor_para_size": 1, "path": "x"})
    assert made == [] and dist.get_context() is None


def test_single_process_without_gpu_fails_at_once(env, monkeypatch):
    monkeypatch.setattr(dist, "_cuda_device_count", lambda: 0)
    with pytest.raises(ValueError, match="rank 0 .*no CUDA device"):
        dist.setup()


def test_single_rank_barrier_reports_failure_and_tp_mismatch(env):
    info = dist.discover()
    with pytest.raises(RuntimeError, match=r"rank 0 \(host .*\): OSError: disk on fire"):
        dist.checkpoint_barrier(info, False, "OSError: disk on fire", 1.0)
    ckpt = {"tensor_para_size": 2, "model_name": "gpt2", "path": "/m/2-gpu"}
    with pytest.raises(RuntimeError, match=r"rank 0: loaded /m/2-gpu, converted for "
                                           r"tensor_para_size 2, but tensor_para_size 1"):
        dist.checkpoint_barrier(info, True, "", 1.0, checkpoint=ckpt)


def test_exchange_id_single_rank(env):
    info = dist.discover()
    assert dist.exchange_id(info, [0], "k", lambda: torch.arange(4, dtype=torch.uint8)) == \
        bytes([0, 1, 2, 3])
    with pytest.raises(ValueError, match="rank 0 is not in group_ranks"):
        dist.exchange_id(info, [1, 2], "k", lambda: b"")


def test_describe_checkpoint():
    from warpformer.config import GptConfig

    cfg = GptConfig(head_num=4, size_per_head=64, inter_size=1024, num_layer=2, vocab_size=100,
                    max_pos_seq_len=64, tensor_para_size=2, model_name="tiny")
    d = dist.describe_checkpoint(cfg, "/x/2-gpu")
    assert d["tensor_para_size"] == 2 and d["model_name"] == "tiny" and d["path"] == "/x/2-gpu"
    assert d["num_layer"] == 2 and d["head_num"] == 4


def test_rank_ranges():
    assert dist._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_rendezvous_needs_an_address(env):
    env(RANK=0, WORLD_SIZE=2)
    info = dist.discover(2)
    with pytest.raises(ValueError, match="no rendezvous.*MASTER_ADDR"):
        dist.rendezvous(info)
    with pytest.raises(ValueError, match="init_method must be"):
        dist.rendezvous(info, init_method="file:///tmp/x")


def test_print0(env, capsys):
    dist.print0("hello")
    env(RANK=1, WORLD_SIZE=2)
    dist.print0("not me")
    assert capsys.readouterr().out == "hello\n"


# ---------------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out, target, kwargs: dict) -> None:
    for var in LAUNCH_VARS:
        os.environ.pop(var, None)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.monotonic()
    try:
        result = target(**kwargs)
        out.put((rank, "ok", result, time.monotonic() - start))
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
        out.put((rank, type(exc).__name__, str(exc), time.monotonic() - start))
        code = 1
    os._exit(code)


def _launch(world: int, wait_s: float, *, hung: int | None = None, target=None,
            **kwargs) -> dict:
    """Fork ``world`` ranks; returns {rank: (status, payload, seconds)}. Every rank but ``hung``
    must end within ``wait_s``; the hung one is then killed, as torchrun/mpirun would."""
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    port = _free_port()
    target = target or _dist_worker.run
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, out, target, kwargs))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + wait_s
        for r, p in enumerate(procs):
            if r != hung:
                p.join(max(0.0, deadline - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if r != hung and p.is_alive()]
        assert not alive, f"ranks {alive} still running after {wait_s} s"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
    assert not any(p.is_alive() for p in procs)
    results = {}
    while not out.empty():
        rank, status, payload, seconds = out.get()
        results[rank] = (status, payload, seconds)
    return results


def test_tp2_pp2_ids_reach_their_groups():
    res = _launch(4, 60, scenario="ok", tp=2, pp=2, timeout=30)
    assert sorted(res) == [0, 1, 2, 3] and all(s == "ok" for s, _, _ in res.values())
    got = {r: payload for r, (_, payload, _) in res.items()}
    for r, g in got.items():
        assert g["info"]["tp_rank"] == r % 2 and g["info"]["pp_rank"] == r // 2
        assert g["rendezvous"] == "StoreRendezvous"
        assert (g["tp"]["rank"], g["tp"]["size"]) == (r % 2, 2)
        assert (g["pp"]["rank"], g["pp"]["size"]) == (r // 2, 2)
    # TP groups {0,1} and {2,3} get the id made by their first rank; PP groups {0,2}, {1,3} too
    assert got[0]["tp"]["uid"] == got[1]["tp"]["uid"] and "rank-0-" in got[0]["tp"]["uid"]
    assert got[2]["tp"]["uid"] == got[3]["tp"]["uid"] and "rank-2-" in got[2]["tp"]["uid"]
    assert got[0]["pp"]["uid"] == got[2]["pp"]["uid"] and "rank-0-" in got[0]["pp"]["uid"]
    assert got[1]["pp"]["uid"] == got[3]["pp"]["uid"] and "rank-1-" in got[1]["pp"]["uid"]
    assert len({got[0]["tp"]["uid"], got[2]["tp"]["uid"], got[1]["pp"]["uid"]}) == 3


@pytest.mark.parametrize("bad", [0, 2])  # rank 0 hosts the store: its failure must not hang
def test_failing_rank_stops_every_rank(bad):
    timeout = 20.0
    res = _launch(3, timeout, scenario="fail", tp=3, timeout=timeout, bad_rank=bad)
    assert sorted(res) == [0, 1, 2]
    for _rank, (status, message, seconds) in res.items():
        assert status == "RuntimeError"
        assert (f"rank {bad} (host {HOST}): WeightFileError: missing weight file "
                "model.wte.bin") in message
        assert "1 of 3 ranks failed while loading weights" in message
        assert "before NCCL starts" in message
        assert seconds < timeout / 2  # everyone reported: no waiting for the timeout


def test_rank_that_never_reports_times_out():
    timeout = 3.0
    res = _launch(3, timeout + 20, hung=1, scenario="hang", tp=3, timeout=timeout, bad_rank=1,
                  hang_s=600)
    assert sorted(res) == [0, 2]  # rank 1 was killed while "loading"
    for _rank, (status, message, seconds) in res.items():
        assert status == "RuntimeError"
        assert "rank 1: did not report within 3 s" in message
        assert timeout - 0.5 <= seconds < timeout + 15


def test_checkpoint_for_another_tp_stops_every_rank():
    res = _launch(2, 30, scenario="ckpt_tp", tp=2, timeout=20, bad_rank=1)
    for _rank, (status, message, _) in res.items():
        assert status == "RuntimeError"
        assert ("rank 1: loaded /ckpt/4-gpu, converted for tensor_para_size 4, but "
                "tensor_para_size 2 was requested") in message
    assert sorted(res) == [0, 1]


def test_ranks_with_different_models_stop():
    res = _launch(2, 30, scenario="ckpt_model", tp=2, timeout=20, bad_rank=0)
    for _rank, (status, message, _) in res.items():
        assert "ranks loaded different models (num_layer differ)" in message
        assert "rank 0: num_layer=8 from /ckpt/2-gpu" in message
        assert "rank 1: num_layer=4 from /ckpt/2-gpu" in message and status == "RuntimeError"
    assert sorted(res) == [0, 1]


def test_rank_without_gpu_stops_every_rank():
    res = _launch(3, 30, scenario="no_gpu", tp=3, timeout=20, bad_rank=1)
    assert sorted(res) == [0, 1, 2]
    for _rank, (status, message, _) in res.items():
        assert status == "ValueError"
        assert f"rank 1 (host {HOST}): no CUDA device visible" in message


def test_two_ranks_on_one_gpu_stop():
    res = _launch(2, 30, scenario="same_gpu", pp=2, timeout=20)
    for _rank, (status, message, _) in res.items():
        assert status == "ValueError" and "shares GPU GPU-fake-0" in message
        assert f"ranks 0-1 (host {HOST})" in message
    assert sorted(res) == [0, 1]


def test_explicit_init_method():
    port = _free_port()
    res = _launch(2, 30, scenario="ok", tp=2, timeout=20,
                  init_method=f"tcp://127.0.0.1:{port}")
    assert all(s == "ok" for s, _, _ in res.values()) and sorted(res) == [0, 1]
    assert all(f"127.0.0.1:{port}" in p["via"] for _, p, _ in res.values())


# ---------------------------------------------------------------------------------- loading
def test_load_gpt_model_tp2(converted):
    model_dir = converted("gpt2", tp=2)
    res = _launch(2, 60, target=_dist_worker.run_load, model_dir=str(model_dir), tp=2)
    assert sorted(res) == [0, 1] and all(s == "ok" for s, _, _ in res.values()), res
    for rank, (_, got, _) in res.items():
        assert got["kwargs"]["tensor_para_rank"] == rank
        assert got["kwargs"]["pipeline_para_size"] == 1
        assert got["tp"]["size"] == 2 and got["tp"]["rank"] == rank and got["pp"] is None
        assert "wte" in got["names"] and "layers.0.attention.query_key_value.weight" in got["names"]
    assert res[0][1]["tp"]["uid"] == res[1][1]["tp"]["uid"]


def test_load_gpt_model_wrong_tp_directory(converted):
    model_dir = converted("gpt2", tp=1)
    res = _launch(2, 60, target=_dist_worker.run_load, model_dir=str(model_dir), tp=2)
    assert sorted(res) == [0, 1]
    for status, message, _ in res.values():
        assert status == "RuntimeError"
        assert f"ranks 0-1: loaded {model_dir}, converted for tensor_para_size 1" in message
        assert "use the 2-gpu directory" in message


def test_load_gpt_model_missing_shard_on_one_rank(converted, tmp_path):
    import shutil as sh

    model_dir = tmp_path / "2-gpu"
    sh.copytree(converted("gpt2", tp=2), model_dir)
    (model_dir / "model.layers.1.mlp.dense_h_to_4h.weight.1.bin").unlink()
    res = _launch(2, 60, target=_dist_worker.run_load, model_dir=str(model_dir), tp=2)
    assert sorted(res) == [0, 1]
    for status, message, _ in res.values():
        assert status == "RuntimeError" and "1 of 2 ranks failed while loading weights" in message
        assert f"rank 1 (host {HOST}): WeightFileError: missing weight file" in message
        assert "model.layers.1.mlp.dense_h_to_4h.weight.1.bin" in message


# ---------------------------------------------------------------------------------- launchers
def _lines(text: str, tag: str) -> list[dict]:
    """The JSON payloads of the worker lines "TAG {json}" in `text` (the launcher's stdout)."""
    out = []
    for line in text.splitlines():
        if line.startswith(tag + " "):
            try:
                out.append(json.loads(line[len(tag) + 1:]))
            except json.JSONDecodeError as exc:  # show the whole output: which writes mixed
                raise AssertionError(f"unreadable {tag} line ({exc}) in:\n{text}") from None
    return out


def _run(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=HERE.parent)
    return proc, time.monotonic() - start


WORKER = [sys.executable, str(HERE / "_dist_worker.py"), "--mock-gpu"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


def test_torchrun_launch():
    proc, _ = _run(TORCHRUN + ["2"] + WORKER[1:] + ["--tp", "2", "--timeout", "30"], 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _lines(proc.stdout, "RESULT")
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["info"]["launcher"] == "torchrun" for r in results)
    assert len({r["tp"]["uid"] for r in results}) == 1


def test_torchrun_failing_rank():
    proc, seconds = _run(TORCHRUN + ["2"] + WORKER[1:] + [
        "--tp", "2", "--timeout", "60", "--scenario", "fail", "--bad-rank", "1"], 120)
    assert proc.returncode != 0
    errors = _lines(proc.stdout, "ERROR")
    assert errors and all(f"rank 1 (host {HOST}): WeightFileError" in e["message"]
                          for e in errors)
    assert all(e["elapsed"] < 30 for e in errors)


MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(
    MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpirun and mpi4py (apt-get install openmpi-bin libopenmpi-dev; "
           "pip install mpi4py)")
MPI_CMD = [MPIRUN or "mpirun", "--allow-run-as-root", "--oversubscribe", "-n"]


@needs_mpi
def test_mpirun_launch():
    proc, _ = _run(MPI_CMD + ["2"] + WORKER + ["--tp", "2", "--timeout", "30"], 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _lines(proc.stdout, "RESULT")
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["rendezvous"] == "MpiRendezvous" for r in results)
    assert all(r["info"]["launcher"] == "mpirun" for r in results)
    assert len({r["tp"]["uid"] for r in results}) == 1 and "rank-0-" in results[0]["tp"]["uid"]


@needs_mpi
def test_mpirun_failing_rank():
    proc, seconds = _run(MPI_CMD + ["3"] + WORKER + [
        "--tp", "3", "--timeout", "60", "--scenario", "fail", "--bad-rank", "2"], 120)
    assert proc.returncode != 0
    errors = _lines(proc.stdout, "ERROR")
    assert errors and all(f"rank 2 (host {HOST}): WeightFileError" in e["message"]
                          for e in errors)
    assert all(e["elapsed"] < 30 for e in errors)


@needs_mpi
def test_mpirun_rank_that_never_reports():
    # the hung rank sleeps 10 minutes; MPI_Abort from the others ends the whole job
    proc, seconds = _run(MPI_CMD + ["2"] + WORKER + [
        "--tp", "2", "--timeout", "3", "--scenario", "hang", "--bad-rank", "1",
        "--hang-s", "600"], 120)
    assert proc.returncode != 0 and seconds < 60
    errors = _lines(proc.stdout, "ERROR")
    assert errors and errors[0]["rank"] == 0
    assert "rank 1: did not report within 3 s" in errors[0]["message"]

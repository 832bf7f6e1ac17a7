"""``warpformer generate`` on CPU (reference backend): a tiny random HF GPT-2 with a word-level
tokenizer, converted once into a cache folder and reused; text and ids in and out against
``GPT.generate`` (and HF's greedy tokens), sampling, beam search, streaming, the output formats,
``examples/generate.py`` (the same code under FT's flags), rank 0 converting for the others under a
launch (GPUs simulated), and the errors users get instead of tracebacks."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer.cli import main as cli_main
from warpformer.demo import build_random_gpt2, default_dataset
from warpformer.gpt import GPT

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The old lighthouse keeper", "She said", "He looked at the"]
N = 8  # new tokens


def run_cli(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``warpformer generate ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_main(["generate", "--backend", "reference", *map(str, argv)])
    finally:
        sys.stdin = old_stdin
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The HF folder, the cache, and the first CLI call (which converts into the cache)."""
    root = tmp_path_factory.mktemp("cli_generate")
    hf = build_random_gpt2(default_dataset(), root / "my-model", layers=1, hidden=64, heads=2,
                           positions=128)
    cache = root / "cache"
    os.environ["WARPFORMER_CACHE"] = str(cache)
    try:
        first = run_cli("--model", hf, "--prompt", PROMPTS[0], "--max-new-tokens", N)
    finally:
        del os.environ["WARPFORMER_CACHE"]
    converted = next(cache.glob("my-model-fp32-*/1-gpu"))
    gpt = GPT.from_pretrained(converted, dtype=torch.float32, max_batch=8, max_seq_len=64,
                              backend="reference")
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    return dict(hf=hf, cache=cache, first=first, converted=converted, gpt=gpt, tok=tok)


@pytest.fixture
def env(world, monkeypatch):
    monkeypatch.setenv("WARPFORMER_CACHE", str(world["cache"]))
    return world


def strip_end(gpt: GPT, ids: list[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] == gpt.end_id else ids


def expected_text(w, prompts: list[str], **kwargs) -> list[list[str]]:
    """Decoded generated text per prompt and beam from GPT.generate."""
    ids = [w["tok"].encode(p) for p in prompts]
    out = w["gpt"].generate(ids, N, **kwargs)
    return [[w["tok"].decode(strip_end(w["gpt"], t)) for t in row] for row in out.tokens]


def text_records(rows: list[list[str]]) -> str:
    """What the text format prints for these outputs."""
    multi = len(rows) * len(rows[0]) > 1
    parts = []
    for i, row in enumerate(rows):
        for k, text in enumerate(row):
            head = (f"[{i}]" if len(row) == 1 else f"[{i}][beam {k}]") + "\n" if multi else ""
            parts.append(head + text + "\n")
    return "".join(parts)


# ------------------------------------------------------------------------------ model input
def test_hf_folder_is_converted_once_then_reused(env):
    rc, out, err = env["first"]
    assert rc == 0, err
    assert f"converted {env['hf']} -> {env['converted']} (fp32)" in err
    assert out == text_records(expected_text(env, PROMPTS[:1]))
    rc, out2, err = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--max-new-tokens", N)
    assert rc == 0 and f"using the converted checkpoint cached in {env['converted']}" in err
    assert f"converted {env['hf']}" not in err and out2 == out
    assert len(list(env["cache"].glob("my-model-fp32-*/1-gpu/config.ini"))) == 1


def test_text_matches_generate_and_hf_greedy(env, tmp_path):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n\n")  # blank lines skipped
    rc, out, err = run_cli("--model", env["hf"], "--input-file", tmp_path / "prompts.txt",
                           "--max-new-tokens", N, "--batch-size", 2)
    assert rc == 0, err
    assert out == text_records(expected_text(env, PROMPTS))
    # the same tokens as HF transformers' own greedy search
    rc, ids_out, _ = run_cli("--model", env["hf"], "--prompt", PROMPTS[1], "--max-new-tokens",
                             N, "--output-format", "ids")
    hf = transformers.AutoModelForCausalLM.from_pretrained(env["hf"]).eval()
    prompt = env["tok"].encode(PROMPTS[1])
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False,
                          pad_token_id=env["gpt"].end_id)[0, len(prompt):].tolist()
    got = [int(t) for t in ids_out.strip().split(",")]
    assert rc == 0 and got[:len(ref)] == ref


def test_memory_len_matches_generate(env):
    """--memory-len N is generate(memory_len=N): each token sees its last N positions."""
    rc, out, err = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--max-new-tokens", N,
                           "--memory-len", 3)
    assert rc == 0, err
    assert out == text_records(expected_text(env, PROMPTS[:1], memory_len=3))


def test_weight_quant_matches_from_pretrained(env):
    """--weight-quant int8 with --data-type bf16 is from_pretrained(weight_quant="int8") on the
    bf16 conversion."""
    rc, out, err = run_cli("--model", env["hf"], "--input-ids", "5,6,7", "--max-new-tokens", N,
                           "--data-type", "bf16", "--weight-quant", "int8", "--output-format",
                           "ids")
    assert rc == 0, err
    folder = next(env["cache"].glob("my-model-bf16-*/1-gpu"))
    gpt = GPT.from_pretrained(folder, dtype=torch.bfloat16, max_batch=1, max_seq_len=16,
                              backend="reference", weight_quant="int8")
    want = gpt.generate([[5, 6, 7]], N).tokens[0][0]
    assert [int(t) for t in out.strip().split(",")] == want


def test_stdin_and_output_file(env, tmp_path):
    rc, out, err = run_cli("--model", env["hf"], "--max-new-tokens", N, "--output-file",
                           tmp_path / "out.txt", stdin="\n".join(PROMPTS[:2]) + "\n")
    assert rc == 0, err
    assert out == "" and f"wrote {tmp_path / 'out.txt'}" in err
    assert (tmp_path / "out.txt").read_text() == text_records(expected_text(env, PROMPTS[:2]))


def test_ids_in_ids_out_without_tokenizer(env, tmp_path):
    rows = [[5, 17, 42], [7, 3]]
    want = "".join(",".join(map(str, r[0])) + "\n"
                   for r in env["gpt"].generate(rows, N).tokens)
    rc, out, err = run_cli("--model", env["converted"], "--input-ids", "5,17,42",
                           "--input-ids", "7 3", "--max-new-tokens", N)
    assert rc == 0 and out == want, err
    (tmp_path / "ids.csv").write_text("5,17,42\n7,3\n")
    rc, out, _ = run_cli("--model", env["converted"].parent, "--input-file",
                         tmp_path / "ids.csv", "--max-new-tokens", N)
    assert rc == 0 and out == want
    # a HF folder with its tokenizer ignored: ids too
    rc, out, _ = run_cli("--model", env["hf"], "--no-tokenizer", "--input-file",
                         tmp_path / "ids.csv", "--max-new-tokens", N)
    assert rc == 0 and out == want


# ------------------------------------------------------------------------------ decoding
def test_sampling_with_a_seed_is_reproducible(env):
    base = ("--model", env["hf"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
            "--max-new-tokens", N)
    args = (*base, "--do-sample", "--top-p", "0.9", "--seed", "7")
    rc, first, err = run_cli(*args)
    assert rc == 0 and "sampling with --seed 7" in err
    assert run_cli(*args)[1] == first
    assert run_cli(*args, "--batch-size", 1)[1] == first  # seed + i per prompt
    assert first == text_records(expected_text(env, PROMPTS[:2], do_sample=True, top_p=0.9,
                                               seed=[7, 8]))
    assert run_cli(*args[:-1], "9")[1] != first
    assert run_cli(*base)[1] != first  # greedy
    # FT's convention: top_k > 1 samples without --do-sample; a drawn seed is printed
    rc, out, err = run_cli(*base, "--top-k", "5", "--seed", "3")
    assert rc == 0 and out == text_records(expected_text(env, PROMPTS[:2], do_sample=True,
                                                         top_k=5, seed=[3, 4]))
    rc, _, err = run_cli(*base, "--top-k", "5")
    assert rc == 0 and "sampling with --seed " in err


def test_beam_search(env):
    rc, out, err = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                           "--max-new-tokens", N, "--num-beams", 3)
    assert rc == 0, err
    assert out == text_records(expected_text(env, PROMPTS[:2], num_beams=3))
    assert out.startswith("[0][beam 0]\n") and "[1][beam 2]\n" in out
    ids = [env["tok"].encode(p) for p in PROMPTS[:2]]
    rc, out, _ = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                         "--max-new-tokens", N, "--num-beams", 3, "--output-format", "ids")
    beams = env["gpt"].generate(ids, N, num_beams=3).tokens
    assert out == "".join(",".join(map(str, t)) + "\n" for row in beams for t in row)


@pytest.mark.parametrize("extra", [(), ("--do-sample", "--temperature", "1.5", "--seed", "5")])
def test_stream_prints_what_the_batch_prints(env, extra):
    args = ("--model", env["hf"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[2],
            "--max-new-tokens", N, *extra)
    rc, batch, _ = run_cli(*args)
    rc2, streamed, err = run_cli(*args, "--stream")
    assert rc == rc2 == 0 and streamed == batch, err
    ids = ("--model", env["converted"], "--input-ids", "5,17,42", "--input-ids", "9",
           "--max-new-tokens", N, *extra)
    assert run_cli(*ids, "--stream")[1] == run_cli(*ids)[1]


def test_jsonl_and_verbose_formats(env, tmp_path):
    rc, out, err = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--max-new-tokens", N,
                           "--num-beams", 2, "--return-log-probs", "--output-format", "jsonl")
    assert rc == 0, err
    rec = json.loads(out)
    ids = env["tok"].encode(PROMPTS[0])
    want = env["gpt"].generate([ids], N, num_beams=2, return_log_probs=True)
    assert rec["prompt"] == PROMPTS[0] and rec["input_ids"] == ids
    assert rec["output_ids"] == want.tokens[0] and len(rec["output"]) == 2
    assert rec["cum_log_probs"] == pytest.approx(want.cum_log_probs[0].tolist())
    assert len(rec["log_probs"][0]) == len(want.tokens[0][0])
    # --stream writes text to stdout and the records to the file
    rc, out, _ = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--max-new-tokens", N,
                         "--stream", "--output-format", "verbose", "--return-cum-log-probs", 1,
                         "--output-file", tmp_path / "v.txt")
    text = (tmp_path / "v.txt").read_text()
    assert rc == 0 and out == text_records(expected_text(env, PROMPTS[:1]))
    assert f"[0][beam 0] input: {PROMPTS[0]}" in text and "[0][beam 0] cum_log_probs: " in text


def test_example_runs_the_same_code_with_ft_flags(env, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_generate",
                                                  ROOT / "examples" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--ckpt_path", str(env["hf"]), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                   "--output_len", str(N), "--top_k", "4", "--random_seed", "1",
                   "--output_format", "text", "--backend", "reference"])
    assert rc == 0
    want = run_cli("--model", env["hf"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                   "--max-new-tokens", N, "--top-k", 4, "--seed", 1)[1]
    assert capsys.readouterr().out == want
    rc = mod.main(["--ckpt_path", str(env["converted"]), "--input_ids", "5,x",
                   "--backend", "reference"])
    assert rc == 2 and "error: --input_ids: 'x' is not a token id" in capsys.readouterr().err


# ------------------------------------------------------------------------------ errors
def _errors(w, tmp: Path) -> list[tuple[list, str]]:
    (tmp / "empty").mkdir()
    (tmp / "notok").mkdir()
    hf, conv = w["hf"], w["converted"]
    return [
        (["--model", tmp / "nope", "--prompt", "x"], f"--model {tmp / 'nope'}: no such folder"),
        (["--model", tmp / "empty", "--prompt", "x"], "is neither a converted checkpoint "
         "(config.ini, in the folder or in one <N>-gpu folder) nor a HF checkpoint"),
        (["--model", hf, "--tokenizer", tmp / "notok", "--prompt", "x"],
         f"--tokenizer {tmp / 'notok'} holds no tokenizer files"),
        (["--model", conv, "--input-ids", "1,x"], "--input-ids: 'x' is not a token id"),
        (["--model", conv, "--input-ids", "1", "--input-ids", "-4"],
         "--input-ids #2: token id -4 is negative"),
        (["--model", conv, "--input-ids", "5,99999"],
         "--input-ids: token id 99999 is outside the model's vocabulary"),
        (["--model", conv, "--prompt", "x"], "--prompt needs a tokenizer"),
        (["--model", conv, "--input-ids", "1", "--output-format", "text"],
         "--output-format text needs a tokenizer"),
        (["--model", hf, "--prompt", "x", "--input-ids", "1"],
         "give the prompts one way, not --prompt and --input-ids"),
        (["--model", hf, "--prompt", "x", "--output-file", tmp / "no" / "out.txt"],
         "--output-file"),
        (["--model", hf, "--prompt", "x", "--stream", "--do-sample", "--top-p", "0.5",
          "--repetition-penalty", "0"],
         "--repetition-penalty: option 'repetition_penalty' must be finite and > 0, got 0"),
        (["--model", hf, "--prompt", "x", "--stream", "--num-beams", "2"],
         "--stream needs --num-beams 1"),
        (["--model", hf, "--prompt", "x", "--do-sample", "--num-beams", "2"],
         "--num-beams 2 runs beam search, which does not sample"),
        (["--model", hf, "--prompt", "x", "--do-sample", "--temperature", "0"],
         "--temperature: option 'temperature' must be finite and > 0"),
        (["--model", hf, "--prompt", "x", "--top-p", "1.5"], "--top-p must be in [0, 1]"),
        (["--model", hf, "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be"),
        (["--model", hf, "--prompt", "x", "--max-new-tokens", "200"],
         "--prompt (1 tokens) + --max-new-tokens 200 = 201 positions, more than the model's 128"),
        (["--model", hf, "--input-file", tmp / "none.txt"], "--input-file"),
        (["--model", hf, "--input-file", "-"], "stdin holds no prompts"),
        (["--model", hf, "--prompt", "x", "--tensor-para-size", "2"],
         "--tensor-para-size/--pipeline-para-size: world size 1"),
        (["--model", hf, "--prompt", "x", "--memory-len", "-1"], "--memory-len must be >= 0"),
        (["--model", hf, "--prompt", "x", "--data-type", "fp32", "--weight-quant", "int8"],
         "weight_quant='int8' quantizes an fp16 or bf16 folder"),
    ]


def test_errors_name_the_argument(env, tmp_path):
    for argv, message in _errors(env, tmp_path):
        rc, out, err = run_cli(*argv, stdin="\n")
        assert rc == 2 and out == "", (argv, err)
        # status lines may come first (an option GPT checks is seen after loading)
        last = err.rstrip("\n").splitlines()[-1]
        assert last.startswith("error: ") and message in last, (argv, err)
        assert "Traceback" not in err


def test_python_dash_m_reads_stdin_and_streams(env):
    """The command as users run it: ``python -m warpformer generate``, prompts piped in."""
    res = subprocess.run([sys.executable, "-m", "warpformer", "generate", "--model",
                          str(env["hf"]), "--backend", "reference", "--max-new-tokens", str(N),
                          "--stream"], input="\n".join(PROMPTS[:2]) + "\n", cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "WARPFORMER_CACHE": str(env["cache"])})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == text_records(expected_text(env, PROMPTS[:2]))
    assert "using the converted checkpoint cached in" in res.stderr


# ------------------------------------------------------------------------------ several ranks
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _convert_rank(rank: int, port: int, hf: str, out) -> None:
    """One rank of a simulated 2-GPU launch calling converted_checkpoint."""
    import warpformer.distributed as dist
    from warpformer.generate_cli import converted_checkpoint

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist._cuda_device_count = lambda: 2
    dist._device_uuid = lambda device: f"GPU-fake-{rank}"
    torch.cuda.set_device = lambda device: None
    said: list[str] = []
    try:
        path = converted_checkpoint(Path(hf), "fp32", 2, say=said.append)
        out.put((rank, "ok", str(path), said))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
        out.put((rank, type(exc).__name__, str(exc), said))
    os._exit(0)


def _launch_two(hf: Path) -> dict:
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_convert_rank, args=(r, port, str(hf), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    results = {}
    while not out.empty():
        rank, status, payload, said = out.get()
        results[rank] = (status, payload, said)
    return results


def test_rank_0_converts_while_the_others_wait(world, tmp_path, monkeypatch):
    monkeypatch.setenv("WARPFORMER_CACHE", str(tmp_path / "cache"))
    for var in ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    res = _launch_two(world["hf"])
    assert sorted(res) == [0, 1] and all(s == "ok" for s, _, _ in res.values()), res
    assert res[0][1] == res[1][1] and res[0][1].endswith("2-gpu")
    assert (Path(res[0][1]) / "config.ini").is_file()
    assert len(res[0][2]) == 1 and res[0][2][0].startswith("converted ")
    assert res[1][2] == []  # rank 1 neither converted nor printed
    # a conversion that fails on rank 0 stops both ranks with its message
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-model"}')
    res = _launch_two(bad)
    assert sorted(res) == [0, 1], res
    for status, message, _ in res.values():
        assert status == "ValueError"
        assert "1 of 2 ranks failed while converting the HF checkpoint" in message
        assert "rank 0 (host" in message

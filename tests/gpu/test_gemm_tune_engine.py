"""gemm-tune asks the engine for its shapes: the list it collects (an instance with random weights
running the workload) equals what a model loaded through warpformer.GPT plans for the same
generate call, prefill groups and prompt graphs included; --prompt-rows covers every prompt
length of its range; a tensor-parallel rank's widths are derived on one GPU; the file the CLI
writes is loaded and used by the engine; and benchmarks/bench_gemm_shapes.py counts the products
of a prompt pass from the engine's plans."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer import GPT
from warpformer.cli import main
from warpformer.config import local_vocab
from warpformer.converters import convert
from warpformer.gemm_tune import (
    GENERATION_STEPS,
    collect_shapes,
    heuristic_rows,
    parse_plan_line,
)
from warpformer.models.gpt import load_gpt_model
from warpformer.options import EngineOptions
from warpformer.weights import read_config

pytestmark = pytest.mark.gpu

# Tiny models of the three residual forms (their products differ: GPT-J's MLP-out accumulates
# onto the attention-out and its lm_head has a bias; OPT-350m has project_in/out and ReLU on the
# MLP-in epilogue).
FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=1000, n_embd=128, n_head=2, n_layer=2,
                                            n_positions=256, bos_token_id=1, eos_token_id=2),
    "gptj": lambda: transformers.GPTJConfig(vocab_size=1000, n_embd=256, n_head=4, n_layer=2,
                                            rotary_dim=32, n_positions=256, bos_token_id=1,
                                            eos_token_id=2),
    "opt350": lambda: transformers.OPTConfig(vocab_size=1000, hidden_size=128,
                                             num_attention_heads=2, num_hidden_layers=2,
                                             ffn_dim=512, word_embed_proj_dim=64,
                                             do_layer_norm_before=False,
                                             max_position_embeddings=256, pad_token_id=1,
                                             bos_token_id=2, eos_token_id=2),
}

_converted: dict[str, Path] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gemm_tune")


def checkpoint(name: str, workdir: Path) -> Path:
    """A random HF model of FAMILIES[name] converted for one GPU in fp16 (once per module)."""
    if name not in _converted:
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(FAMILIES[name]())
        hf.save_pretrained(workdir / f"{name}-hf")
        convert(workdir / f"{name}-hf", workdir / f"{name}-wf", 1, "fp16")
        _converted[name] = workdir / f"{name}-wf" / "1-gpu"
    return _converted[name]


def keys(shapes) -> set[tuple]:
    return {s.key() for s in shapes}


def gpt_plans(path: Path, batch: int, beam: int, length: int, **options) -> set[tuple]:
    """The cuBLASLt shapes a model loaded through warpformer.GPT plans for one generate call of
    `batch` prompts of `length` tokens at beam width `beam` (GENERATION_STEPS new tokens, none
    ending early), as gemm-tune's workload is."""
    model = GPT.from_pretrained(path, dtype=torch.float16, max_batch=batch,
                                max_seq_len=length + GENERATION_STEPS, **options)
    ids = torch.randint(3, model.vocab_size, (batch, length), dtype=torch.int32)
    model.generate(ids, GENERATION_STEPS, num_beams=beam, min_length=GENERATION_STEPS)
    return {parse_plan_line(line).key() for line in model.engine.gemm_plan_shapes()}


@pytest.mark.parametrize("batch,beam", [(9, 1), (3, 3)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_shapes_are_what_the_engine_plans(family, batch, beam, workdir):
    """Same dimensions, random weights on both sides, same workload: the tuner's list is the
    loaded model's plan list, the prompt's one-group pass (144 or 48 tokens, a prompt graph) and
    the 9-row generation steps (past the GEMV's 8 rows) among them."""
    path = checkpoint(family, workdir)
    shapes = collect_shapes(read_config(path), batch, beam, 16)
    assert keys(shapes) and keys(shapes) == gpt_plans(path, batch, beam, 16)
    assert any(s.m == batch * beam and s.what == "generation" for s in shapes), shapes
    assert {s.what for s in shapes} == {"prompt", "generation"}


def test_prefill_groups_set_the_prompt_rows(workdir):
    """4 prompts of 100 tokens with prefill_tokens=256 run as two groups of 200 tokens (exact
    counts: several groups are not a prompt graph), which the tuner lists as the engine plans
    them; with the default group size they are one group of 400 tokens."""
    path = checkpoint("gpt2", workdir)
    config = read_config(path)
    h = config.hidden_size

    def qkv_rows(shapes) -> set[int]:
        return {s.m for s in shapes if (s.n, s.k) == (3 * h, h) and s.what == "prompt"}

    grouped = collect_shapes(config, 4, 1, 100, prefill_tokens=256)
    assert qkv_rows(grouped) == {200}
    assert keys(grouped) == gpt_plans(path, 4, 1, 100, prefill_tokens=256)
    whole = collect_shapes(config, 4, 1, 100)
    rows = qkv_rows(whole)
    assert len(rows) == 1 and min(rows) >= 400, rows
    assert keys(whole) == gpt_plans(path, 4, 1, 100)
    eager = collect_shapes(config, 4, 1, 100, cuda_graphs=False)
    assert qkv_rows(eager) == {400}
    assert keys(eager) == gpt_plans(path, 4, 1, 100, cuda_graphs=False)


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_prompt_rows_cover_every_length_in_the_range(cuda_graphs, workdir):
    """--prompt-rows 129:176: a prompt of any length in the range, on a model with or without
    CUDA graphs, plans products whose rounded row count (the tuning-file entry that serves
    them) the tuner listed."""
    path = checkpoint("gpt2", workdir)
    listed = keys(collect_shapes(read_config(path), 1, 1, 16, prompt_rows=(129, 176),
                                 cuda_graphs=cuda_graphs))
    model = load_gpt_model(path, max_batch=1, max_seq_len=177,
                           options=EngineOptions(cuda_graphs=cuda_graphs))
    ids = torch.randint(3, 1000, (1, 176), dtype=torch.int32)
    for n in (129, 130, 150, 160, 161, 176):
        model.generate(ids[:, :n].contiguous(), torch.tensor([n], dtype=torch.int32), 1)
    planned = [parse_plan_line(line) for line in model.gemm_plan_shapes()]
    assert planned
    for s in planned:
        assert dataclasses.replace(s, m=heuristic_rows(s.m)).key() in listed, s


def test_tensor_parallel_rank_widths(workdir):
    """GPT-J at tensor_para_size 2, derived on one GPU: QKV and MLP-in keep k = hidden and halve
    n, attention-out and MLP-out halve k, the lm_head multiplies the rank's vocabulary slice;
    prompts at their exact token count (a parallel model has no prompt graphs)."""
    path = checkpoint("gptj", workdir)
    config = dataclasses.replace(read_config(path), tensor_para_size=2)
    h, inter = config.hidden_size, config.inter_size
    shapes = collect_shapes(config, 9, 1, 16)
    assert {(s.n, s.k) for s in shapes if not s.transposed} == {
        (3 * h // 2, h), (h, h // 2), (inter // 2, h), (h, inter // 2)}
    assert {(s.n, s.k, s.epilogue) for s in shapes if s.transposed} == \
        {(local_vocab(1000, 2), h, "bias")}
    assert {s.m for s in shapes} == {9 * 16, 9}


def test_cli_file_is_loaded_and_used(tmp_path, workdir, capsys):
    """warpformer gemm-tune end to end (2 candidates, 2 launches each): the file it writes
    loads into a model of that checkpoint, whose plans for the same workload all take their
    algorithm from it."""
    path = checkpoint("gpt2", workdir)
    out = tmp_path / "gemm.tsv"
    assert main(["gemm-tune", "--model-dir", str(path), "--batch-size", "9",
                 "--max-input-len", "16", "--max-algos", "2", "--reps", "2",
                 "--output", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    text = out.read_text().splitlines()
    assert text[0].startswith("# fingerprint gpu=")
    lines = [line for line in text if not line.startswith("#")]
    assert lines and all(line.startswith("fp16 ") for line in lines)
    model = GPT.from_pretrained(path, max_batch=9, max_seq_len=16 + GENERATION_STEPS,
                                gemm_config=out)
    assert model.engine.gemm_tuned_shapes() == len(lines) > 0
    ids = torch.randint(3, 1000, (9, 16), dtype=torch.int32)
    model.generate(ids, GENERATION_STEPS, min_length=GENERATION_STEPS)
    assert len(model.engine.gemm_plan_shapes()) == len(lines)
    assert model.engine.gemm_tuned_plans() == len(lines)


def test_bench_gemm_shapes_counts_the_engine_plans(workdir):
    """bench_gemm_shapes' products of a prompt pass, from the engine's plans: with
    prefill_tokens=256, 4 x 100 tokens run as two groups of 200 and 5 x 100 as 200, 200 and 100;
    9 x 16 as one group at its prompt graph's 192 rows, with the 9-row lm_head (4 or 5 rows run
    on the GEMV). Each layer product counts once per layer and group, the lm_head once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    bench = importlib.import_module("bench_gemm_shapes")
    config = read_config(checkpoint("gpt2", workdir))
    layer = {"attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h",
             "mlp.dense_4h_to_h"}
    for batch, length, prefill, want in ((4, 100, 256, [200, 200]),
                                         (5, 100, 256, [200, 200, 100]),
                                         (9, 16, None, [192])):
        planned = bench.prompt_pass(collect_shapes(config, batch, 1, length,
                                                   prefill_tokens=prefill), batch)
        groups, products = bench.pass_products(planned, config, bench.Case(batch, length))
        assert groups == want, (batch, length)
        assert {s.what for s, _ in products} == layer | ({"lm_head"} if batch > 8 else set())
        for s, n in products:
            assert n == (1 if s.what == "lm_head" else config.num_layer * groups.count(s.m)), s


def test_encoder_decoder_shapes_are_the_engines_and_the_file_is_used(tmp_path):
    """An encoder-decoder folder (T5 shape): collect_seq2seq_shapes lists the cuBLASLt products
    of the encoder and the prompt (batch x input rows) and of the steps; the CLI's file is loaded
    by a Seq2Seq of that folder, which takes its algorithms for those shapes."""
    from warpformer.gemm_tune import collect_seq2seq_shapes
    from warpformer.seq2seq import Seq2Seq
    from warpformer.t5_weights import read_t5_config

    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=256, d_model=128, d_kv=64, d_ff=256, num_layers=2, num_heads=2))
    hf.save_pretrained(tmp_path / "hf")
    out = convert(tmp_path / "hf", tmp_path / "wf", 1, "fp16").output_dir
    shapes = collect_seq2seq_shapes(read_t5_config(out), 4, 2, 48)
    assert {s.what for s in shapes} >= {"encode + prompt"}
    assert any(s.m == 4 * 48 and s.k == 128 for s in shapes)  # the encoder's products
    path = tmp_path / "t5.tsv"
    assert main(["gemm-tune", "--model-dir", str(out), "--batch-size", "4", "--beam-width", "2",
                 "--max-input-len", "48", "--max-algos", "2", "--reps", "2",
                 "--output", str(path)]) == 0
    model = Seq2Seq.from_pretrained(out, dtype=torch.float16, max_batch=4, max_seq_len=64,
                                    gemm_config=path)
    assert int(model.engine.gemm_tuned_shapes()) == len(path.read_text().splitlines()) - 2
    ids = torch.randint(0, 256, (4, 48), dtype=torch.int32)
    model.generate(ids, GENERATION_STEPS, num_beams=2)

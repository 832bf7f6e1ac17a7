"""GEMM tuning on the CPU: the engine's plan lines as shapes, the model the CLI arguments
describe, one tensor-parallel rank's widths, the rounded row counts, the file format.
(tests/gpu/test_gemm_tune_engine.py checks the shapes against an engine's plans.)"""

from __future__ import annotations

import argparse

import pytest
import torch

import warpformer  # noqa: F401  (the engine's weight table)
import warpformer.gemm_tune as gemm_tune
from warpformer.cli import build_parser, main
from warpformer.config import ConfigError, GptConfig
from warpformer.gemm_tune import (
    MAX_WEIGHT_COPIES,
    SHAPE_LAYERS,
    GemmShape,
    config_from_args,
    heuristic_rows,
    one_gpu_config,
    parse_plan_line,
    parse_prompt_rows,
    rank_shapes,
    row_buckets,
    weight_copies,
    write_tuning_file,
)


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["gemm-tune", *argv])


def test_plan_lines_parse_into_shapes() -> None:
    """gemm_plan_shapes() lines (Gemm::plan_shapes: the tuning file's key columns)."""
    assert parse_plan_line("float16 144 3072 1024 0 none 0") == GemmShape(144, 3072, 1024)
    s = parse_plan_line("bfloat16 9 50264 1024 1 bias 0", "generation")
    assert s == GemmShape(9, 50264, 1024, True, "bias", False, "generation")
    assert s.key() == (9, 50264, 1024, True, "bias", False)
    s = parse_plan_line("float32 16 4096 16384 0 none 1")
    assert (s.accumulate, s.epilogue, s.transposed) == (True, "none", False)
    assert parse_plan_line("float16 8 4096 1024 0 bias_gelu_tanh 0").epilogue == "bias_gelu_tanh"
    for bad in ("", "float16 144 3072 1024 0 none", "fp16 144 3072 1024 0 none 0",
                "float16 144 3072 -1 0 none 0", "float16 144 3072 1024 2 none 0",
                "float16 144 3072 1024 0 none 0 7", "float16 1.5 3072 1024 0 none 0"):
        with pytest.raises(ValueError, match="not a gemm_plan_shapes"):
            parse_plan_line(bad)


def test_cli_requires_dimensions() -> None:
    with pytest.raises(SystemExit, match="give --model-dir, or all of --head-num"):
        main(["gemm-tune", "--batch-size", "2"])
    with pytest.raises(SystemExit, match="--batch-size must be >= 1"):
        main(["gemm-tune", "--batch-size", "0", "--head-num", "2"])
    with pytest.raises(SystemExit, match="--pipeline-para-size must be >= 1"):
        main(["gemm-tune", "--pipeline-para-size", "0", "--head-num", "2"])
    with pytest.raises(SystemExit, match="--prefill-tokens must be >= 1"):
        main(["gemm-tune", "--prefill-tokens", "0", "--head-num", "2"])


def test_size_arguments_describe_the_model() -> None:
    """FT's gpt_gemm sizes become the GptConfig the tuner builds an engine of."""
    c = config_from_args(_args("--head-num", "16", "--size-per-head", "64", "--inter-size",
                               "4096", "--vocab-size", "50257", "--activation-type", "relu"))
    assert (c.hidden_size, c.inter_size, c.vocab_size, c.tensor_para_size) == \
        (1024, 4096, 50257, 1)
    assert (c.activation_type, c.num_layer, c.layernorm_type) == \
        ("relu", SHAPE_LAYERS, "pre_layernorm")
    assert not c.parallel_residual and not c.word_embed_proj_dim
    c = config_from_args(_args("--head-num", "32", "--size-per-head", "128", "--inter-size",
                               "16384", "--vocab-size", "50400", "--tensor-para-size", "4"))
    assert (c.head_num, c.tensor_para_size, c.activation_type) == (32, 4, "gelu_tanh")
    with pytest.raises(ConfigError, match="head_num .* divisible by tensor_para_size"):
        config_from_args(_args("--head-num", "6", "--size-per-head", "64", "--inter-size",
                               "1536", "--vocab-size", "100", "--tensor-para-size", "4"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without "
                                                      "a GPU")
def test_cli_needs_a_gpu() -> None:
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        main(["gemm-tune", "--head-num", "2", "--size-per-head", "64", "--inter-size", "512",
              "--vocab-size", "100"])


def test_config_from_a_converted_checkpoint(tmp_path) -> None:
    """--model-dir takes the checkpoint's config.ini (every switch that decides the products),
    at --tensor-para-size when given."""
    import transformers

    from warpformer.converters import convert

    opt = transformers.OPTConfig(vocab_size=300, hidden_size=64, num_attention_heads=2,
                                 num_hidden_layers=1, ffn_dim=128, word_embed_proj_dim=32,
                                 do_layer_norm_before=False, max_position_embeddings=64,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=0)
    gptj = transformers.GPTJConfig(vocab_size=300, n_embd=64, n_head=2, n_layer=1,
                                   rotary_dim=16, n_positions=64, bos_token_id=1,
                                   eos_token_id=2)
    for name, cfg, tp in (("opt", opt, 1), ("gptj", gptj, 2)):
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / name)
        convert(tmp_path / name, tmp_path / f"{name}-wf", tp, "fp16")
    c = config_from_args(_args("--model-dir", str(tmp_path / "opt-wf"), "--tensor-para-size",
                               "2"))
    assert (c.hidden_size, c.inter_size, c.vocab_size, c.tensor_para_size,
            c.word_embed_proj_dim) == (64, 128, 300, 2, 32)
    assert (c.parallel_residual, c.activation_type, c.has_lm_head_bias, c.layernorm_type) == \
        (False, "relu", False, "post_layernorm")
    c = config_from_args(_args("--model-dir", str(tmp_path / "gptj-wf")))  # the checkpoint's tp
    assert (c.hidden_size, c.inter_size, c.tensor_para_size, c.word_embed_proj_dim) == \
        (64, 256, 2, 0)
    assert (c.parallel_residual, c.activation_type, c.has_lm_head_bias, c.rotary_embedding_dim) \
        == (True, "gelu_tanh", True, 16)
    c = config_from_args(_args("--model-dir", str(tmp_path / "gptj-wf"), "--tensor-para-size",
                               "1"))
    assert c.tensor_para_size == 1


def test_one_gpu_config() -> None:
    """The collecting model: one GPU, at most SHAPE_LAYERS layers (all run the same products), a
    position table long enough for the workload; the rest as given."""
    big = GptConfig(head_num=32, size_per_head=128, inter_size=16384, num_layer=28,
                    vocab_size=50400, max_pos_seq_len=2048, tensor_para_size=4,
                    parallel_residual=True, has_lm_head_bias=True)
    c = one_gpu_config(big, 3000)
    assert (c.tensor_para_size, c.num_layer, c.max_pos_seq_len) == (1, SHAPE_LAYERS, 3000)
    assert (c.hidden_size, c.inter_size, c.parallel_residual, c.has_lm_head_bias) == \
        (4096, 16384, True, True)
    assert one_gpu_config(big, 100).max_pos_seq_len == 2048
    rotary = GptConfig(head_num=2, size_per_head=64, inter_size=512, num_layer=1, vocab_size=100,
                       has_positional_encoding=False, rotary_embedding_dim=32)
    c = one_gpu_config(rotary, 5000)
    assert (c.num_layer, c.max_pos_seq_len) == (1, 0)


def test_rank_shapes_narrow_what_tensor_parallelism_splits() -> None:
    """One rank of tp = 2: QKV and MLP-in keep k = hidden and halve n, attention-out and MLP-out
    halve k; the lm_head multiplies ceil(V / 2) rows rounded up to 8s; OPT-350m's project_in/out
    are whole on every rank; epilogue, accumulation and m stay."""
    h, inter, v = 256, 1024, 1001
    gptj = GptConfig(head_num=4, size_per_head=64, inter_size=inter, num_layer=1, vocab_size=v,
                     has_positional_encoding=False, rotary_embedding_dim=32,
                     parallel_residual=True, tensor_para_size=2, has_lm_head_bias=True)
    full = [GemmShape(144, 3 * h, h, what="prompt"), GemmShape(144, h, h),
            GemmShape(144, inter, h, epilogue="bias_gelu_tanh"),
            GemmShape(144, h, inter, accumulate=True), GemmShape(9, 1008, h, True, "bias")]
    got = {s.key() for s in rank_shapes(full, gptj)}
    assert got == {(144, 3 * h // 2, h, False, "none", False),
                   (144, h, h // 2, False, "none", False),
                   (144, inter // 2, h, False, "bias_gelu_tanh", False),
                   (144, h, inter // 2, False, "none", True),
                   (9, 504, h, True, "bias", False)}
    assert rank_shapes(full[:1], gptj)[0].what == "prompt"
    opt350 = GptConfig(head_num=2, size_per_head=64, inter_size=512, num_layer=1, vocab_size=1000,
                       max_pos_seq_len=64, word_embed_proj_dim=64, activation_type="relu",
                       layernorm_type="post_layernorm", tensor_para_size=2)
    project = [GemmShape(16, 128, 64), GemmShape(16, 64, 128)]
    assert {s.key() for s in rank_shapes(project, opt350)} == {s.key() for s in project}
    # An MLP as wide as the residual: its MLP-in [h, h] (n split) and the attention-out [h, h]
    # (k split) look alike at full width; the rank gets both.
    square = GptConfig(head_num=2, size_per_head=64, inter_size=128, num_layer=1, vocab_size=100,
                       max_pos_seq_len=64, tensor_para_size=2)
    assert {(s.n, s.k) for s in rank_shapes([GemmShape(16, 128, 128)], square)} == \
        {(128, 64), (64, 128)}


def test_rounded_row_counts_mirror_the_engine() -> None:
    # Gemm::heuristic_rows: exact up to 64, then a step of max(16, bit_ceil(m) / 16); the GPU test
    # of the engine's reuse (tests/gpu/test_gemm.py) has 513-576 share 576 and 577 start 640.
    assert [heuristic_rows(m) for m in (1, 64, 65, 80, 81, 256, 257, 513, 576, 577, 1025)] == \
        [1, 64, 80, 80, 96, 256, 288, 576, 576, 640, 1152]
    buckets = row_buckets(60, 2100)
    assert buckets[:6] == [60, 61, 62, 63, 64, 80] and buckets[-2:] == [2048, 2304]
    assert all(heuristic_rows(m) in buckets for m in range(60, 2101))
    assert buckets == sorted(set(buckets))
    assert row_buckets(513, 600) == [576, 640]
    for lo, hi in ((0, 5), (9, 8)):
        with pytest.raises(ValueError, match="1 <= lo <= hi"):
            row_buckets(lo, hi)


def test_prompt_rows_option() -> None:
    assert parse_prompt_rows(None) is None
    assert parse_prompt_rows("256:2048") == (256, 2048)
    for bad in ("256", "0:4", "9:8", "a:b", "1:2:3", ":5"):
        with pytest.raises(SystemExit, match="--prompt-rows must be LO:HI with 1 <= LO <= HI"):
            parse_prompt_rows(bad)
    with pytest.raises(SystemExit, match="--prompt-rows must be LO:HI"):
        main(["gemm-tune", "--head-num", "2", "--size-per-head", "64", "--inter-size", "512",
              "--vocab-size", "100", "--prompt-rows", "5:1"])


def test_weight_copies_span_the_cold_bytes() -> None:
    """The tuner times a weight smaller than L2 on copies that together span cold_bytes, so each
    launch reads its copy from DRAM as a model's pass does; a larger weight needs one copy."""
    l2_twice = 2 * 50 * 2**20
    assert weight_copies(6 * 2**20, l2_twice) == 17  # ceil(100 / 6)
    assert weight_copies(2 * 2**20, l2_twice) == 50
    assert weight_copies(128 * 2**20, l2_twice) == 1
    assert weight_copies(l2_twice, l2_twice) == 1
    assert weight_copies(l2_twice - 1, l2_twice) == 2
    assert weight_copies(4096, l2_twice) == MAX_WEIGHT_COPIES  # tiny weights: capped
    assert weight_copies(4096, 0) == 1  # warm: one copy
    with pytest.raises(ValueError, match="weight_bytes must be >= 1"):
        weight_copies(0, l2_twice)
    with pytest.raises(ValueError, match="cold_bytes must be >= 0"):
        weight_copies(4096, -1)


def test_tuning_file_format(tmp_path) -> None:
    """The fingerprint line, a header, then one line per shape: the plan line's key columns
    (dtype as the file spells it), the chosen index and the two timings."""
    path = tmp_path / "gemm.tsv"
    results = [(GemmShape(144, 3072, 1024, what="prompt"), 3, 10.5, 12.25),
               (GemmShape(9, 50264, 1024, True, "bias"), 0, 7.0, 7.0),
               (GemmShape(9, 1024, 4096, accumulate=True), 1, 2.125, 3.0)]
    write_tuning_file(str(path), "fp16", results, fingerprint="gpu=Test_GPU;cublaslt=1")
    assert path.read_text().splitlines() == [
        "# fingerprint gpu=Test_GPU;cublaslt=1",
        "# dtype m n k transposed epilogue accumulate algo_index best_us heuristic_us",
        "fp16 144 3072 1024 0 none 0 3 10.50 12.25",
        "fp16 9 50264 1024 1 bias 0 0 7.00 7.00",
        "fp16 9 1024 4096 0 none 1 1 2.12 3.00",
    ]
    assert list(tmp_path.iterdir()) == [path]  # written through a temporary, then renamed
    # A data line's key columns are a plan line's with the file's dtype name.
    for line, (shape, *_) in zip(path.read_text().splitlines()[2:], results, strict=True):
        assert parse_plan_line("float16 " + " ".join(line.split()[1:7])).key() == shape.key()


def test_run_drives_the_engine_with_the_given_workload(monkeypatch, tmp_path, capsys) -> None:
    """The CLI's workload and engine options reach collect_shapes (which builds and runs the
    engine), its shapes reach tune, and the results the file; no GPU needed to check the wiring."""
    calls = {}
    shape = GemmShape(144, 384, 128, what="prompt")

    def collect(config, batch, beam, max_input_len, **options):
        calls["collect"] = (config, batch, beam, max_input_len, options)
        return [shape]

    def timed(shapes, dtype, max_algos, reps, cold_bytes=None):
        calls["tune"] = (shapes, dtype, max_algos, reps, cold_bytes)
        return [(shapes[0], 2, 5.0, 10.0)]

    monkeypatch.setattr(gemm_tune, "collect_shapes", collect)
    monkeypatch.setattr(gemm_tune, "tune", timed)
    monkeypatch.setattr(gemm_tune, "write_tuning_file",
                        lambda *args: calls.setdefault("write", args))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    out = str(tmp_path / "gemm.tsv")
    assert main(["gemm-tune", "--head-num", "2", "--size-per-head", "64", "--inter-size", "512",
                 "--vocab-size", "1000", "--batch-size", "9", "--beam-width", "2",
                 "--max-input-len", "16", "--data-type", "bf16", "--prefill-tokens", "256",
                 "--no-cuda-graphs", "--prompt-rows", "129:176", "--pipeline-para-size", "2",
                 "--max-algos", "4", "--reps", "3", "--warm-weights", "--output", out]) == 0
    config, batch, beam, n_in, options = calls["collect"]
    assert (config.hidden_size, config.inter_size, config.vocab_size) == (128, 512, 1000)
    assert (batch, beam, n_in) == (9, 2, 16)
    assert options == {"dtype": torch.bfloat16, "cuda_graphs": False, "prefill_tokens": 256,
                       "prompt_rows": (129, 176), "pipeline_para_size": 2}
    assert calls["tune"] == ([shape], torch.bfloat16, 4, 3, 0)
    assert calls["write"] == (out, "bf16", [(shape, 2, 5.0, 10.0)])
    printed = capsys.readouterr().out
    assert "prompt" in printed and "2.00x" in printed and f"wrote 1 shapes to {out}" in printed
    # Defaults: the engine's own group size, CUDA graphs, cold weights.
    main(["gemm-tune", "--head-num", "2", "--size-per-head", "64", "--inter-size", "512",
          "--vocab-size", "1000", "--output", out])
    assert calls["collect"][1:4] == (1, 1, 128)
    assert calls["collect"][4] == {"dtype": torch.float16, "cuda_graphs": True,
                                   "prefill_tokens": None, "prompt_rows": None,
                                   "pipeline_para_size": 1}
    assert calls["tune"][4] is None


def _t5_dir(tmp_path):
    """A converted encoder-decoder folder's config.ini (no weights: the CLI reads the config)."""
    from warpformer.t5_config import T5Config, T5StackConfig

    stack = dict(vocab_size=40, d_model=64, d_kv=32, d_ff=96, num_layers=3, num_heads=2)
    path = tmp_path / "t5-wf" / "1-gpu"
    path.mkdir(parents=True)
    T5Config(encoder=T5StackConfig(**stack), decoder=T5StackConfig(**stack)).to_ini(
        path / "config.ini")
    return path


def test_encoder_decoder_folder_tunes_its_workload(monkeypatch, tmp_path) -> None:
    """An encoder-decoder --model-dir (FT's t5_gemm workload: batch, beam, encoder input length)
    reaches collect_seq2seq_shapes; the decoder-only workload options are refused for it."""
    from warpformer.t5_config import T5Config

    path = _t5_dir(tmp_path)
    assert isinstance(config_from_args(_args("--model-dir", str(path))), T5Config)
    calls = {}
    shape = GemmShape(32, 192, 64, what="encode + prompt")

    def collect(config, batch, beam, max_input_len, **options):
        calls["collect"] = (config, batch, beam, max_input_len, options)
        return [shape]

    monkeypatch.setattr(gemm_tune, "collect_seq2seq_shapes", collect)
    monkeypatch.setattr(gemm_tune, "tune", lambda shapes, *a, **k: [(shapes[0], 0, 1.0, 1.0)])
    monkeypatch.setattr(gemm_tune, "write_tuning_file", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert main(["gemm-tune", "--model-dir", str(path), "--batch-size", "4", "--beam-width", "3",
                 "--max-input-len", "32", "--output", str(tmp_path / "t.tsv")]) == 0
    config, batch, beam, n_in, options = calls["collect"]
    assert (config.d_model, config.decoder.num_layers, batch, beam, n_in) == (64, 3, 4, 3, 32)
    assert options == {"dtype": torch.float16, "cuda_graphs": True}
    for extra in (["--prompt-rows", "16:64"], ["--pipeline-para-size", "2"],
                  ["--prefill-tokens", "256"]):
        with pytest.raises(SystemExit, match="are for decoder-only models"):
            main(["gemm-tune", "--model-dir", str(path), *extra])

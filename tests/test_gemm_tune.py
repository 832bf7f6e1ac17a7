"""GEMM tuning: the shape list mirrors the engine's GEMM calls; CLI argument rules; file format."""

from __future__ import annotations

import argparse

import pytest

from warpformer.cli import main
from warpformer.config import GptConfig
from warpformer.gemm_tune import (
    MAX_WEIGHT_COPIES,
    GemmShape,
    ModelDims,
    activation_bytes_per_token,
    decode_rows,
    dims_from_args,
    ffn_in_epilogue,
    gemm_shapes,
    heuristic_rows,
    parse_prompt_rows,
    prefill_group_tokens,
    prefill_groups,
    prompt_graph_tokens,
    prompt_pass_rows,
    row_buckets,
    weight_copies,
)


def test_shapes_gpt2_like() -> None:
    dims = ModelDims(hidden=1024, inter=4096, vocab=50257)
    shapes = gemm_shapes(dims, batch=8, beam=1, max_input_len=128)
    keys = {(s.m, s.n, s.k, s.transposed, s.epilogue, s.accumulate) for s in shapes}
    assert (1024, 3072, 1024, False, "none", False) in keys      # context QKV, 8 * 128 tokens
    # FFN in: tanh-GELU on cuBLASLt's epilogue (16-bit types)
    assert (1024, 4096, 1024, False, "bias_gelu_tanh", False) in keys
    assert (8, 4096, 1024, False, "bias_gelu_tanh", False) in keys
    assert (8, 50264, 1024, True, "none", False) in keys         # lm_head, V padded to 8s
    assert len(keys) == len(shapes)                                # deduplicated
    # fp32 keeps warpformer's GELU kernel
    ffn_in = {s.epilogue for s in gemm_shapes(dims, 8, 1, 128, dtype_bytes=4)
              if s.what.endswith("ffn in")}
    assert ffn_in == {"none"}
    assert ffn_in_epilogue(dims) == "bias_gelu_tanh"
    assert ffn_in_epilogue(dims, dtype_bytes=4) == "none"
    erf = ModelDims(hidden=1024, inter=4096, vocab=50257, activation="gelu_erf")
    assert ffn_in_epilogue(erf) == "none"


def test_shapes_follow_switches_and_tp() -> None:
    gptj = ModelDims(hidden=4096, inter=16384, vocab=50400, tensor_para_size=2,
                     parallel_residual=True, lm_head_bias=True)
    s = {(x.what, x.m): x for x in gemm_shapes(gptj, batch=1, beam=4, max_input_len=16)}
    assert s[("decode ffn out", 4)] == GemmShape(4, 4096, 8192, accumulate=True,
                                                 what="decode ffn out")
    assert s[("decode qkv", 4)].n == 3 * 2048
    assert s[("decode lm_head", 4)].epilogue == "bias"
    # The lm_head: each rank's slice, ceil(V / tp) (all of V on one GPU) rounded up to 8s.
    assert s[("decode lm_head", 4)].n == 25200
    for tp, n in ((1, 50264), (2, 25136), (4, 12568)):
        dims = ModelDims(hidden=1024, inter=4096, vocab=50257, tensor_para_size=tp)
        lm = [x for x in gemm_shapes(dims, 2, 2, 16) if x.what == "decode lm_head"]
        assert [(x.n, x.k, x.transposed) for x in lm] == [(n, 1024, True)]
    opt350 = ModelDims(hidden=1024, inter=4096, vocab=50272, word_embed_proj_dim=512,
                       activation="relu")
    t = {x.what: x for x in gemm_shapes(opt350, batch=2, beam=3, max_input_len=8)}
    assert t["context ffn in"].epilogue == "bias_relu"
    assert (t["decode project_out"].m, t["decode project_out"].n) == (6, 512)
    assert (t["decode lm_head"].n, t["decode lm_head"].k) == (50272, 512)
    assert t["context project_in"].m == 16


def test_prefill_groups_mirror_the_engine() -> None:
    # Same batches as the GPU tests of GptModel::plan_prefill (tests/gpu/test_gpt_engine.py).
    assert prefill_groups([500, 3, 480, 500, 1, 500, 497, 250, 500], 1024) == [983, 1001, 747, 500]
    assert prefill_groups([1023, 2, 2500, 1, 900, 1200], 1024) == [1023, 2, 2500, 901, 1200]
    assert prefill_groups([300, 260, 300, 10, 300, 300, 280, 300], 1024) == [860, 890, 300]
    assert prefill_groups([128] * 64, 2048) == [2048] * 4
    assert prefill_groups([7], 2048) == [7]
    gptj = ModelDims(hidden=4096, inter=16384, vocab=50400, parallel_residual=True)
    gpt2m = ModelDims(hidden=1024, inter=4096, vocab=50257)
    opt13 = ModelDims(hidden=2048, inter=8192, vocab=50272, activation="relu")
    opt350 = ModelDims(hidden=1024, inter=4096, vocab=50272, word_embed_proj_dim=512,
                       activation="relu", pre_layernorm=False)
    # GptModel::activation_bytes_per_token: x, n, p (+ y post-norm), max(qkv + q + a, MLP hidden)
    # (+ OPT-350m's embedding), 2 bytes each in fp16.
    assert activation_bytes_per_token(gpt2m) == 2 * (3 * 1024 + 5 * 1024) == 16384
    assert activation_bytes_per_token(opt350) == 2 * (4 * 1024 + 5 * 1024 + 512)
    assert activation_bytes_per_token(gptj, 4) == 4 * (3 * 4096 + 5 * 4096)
    tp2 = ModelDims(hidden=4096, inter=16384, vocab=50400, tensor_para_size=2)
    # the local heads' region (5 x 2048) against the local MLP hidden (8192); x, n, p stay whole
    assert activation_bytes_per_token(tp2) == 2 * (3 * 4096 + 5 * 2048)
    # 4,096-token groups while they hold at most 64 MiB of activations, else 2,048.
    assert prefill_group_tokens(gpt2m) == 4096  # exactly 64 MiB
    assert prefill_group_tokens(gpt2m, dtype_bytes=4) == 2048
    for dims in (gptj, opt13, opt350):
        assert prefill_group_tokens(dims) == 2048, dims
    # Batch 64 x 128: gpt-j-6b's prompt runs as four 2048-token groups, gpt2-medium's as two of
    # 4096.
    for dims, want in ((gptj, {2048}), (gpt2m, {4096})):
        ctx = {s.m for s in gemm_shapes(dims, batch=64, beam=1, max_input_len=128)
               if s.what == "context qkv"}
        assert ctx == want
    # The prefill_tokens engine option replaces the engine's choice.
    assert prefill_group_tokens(gpt2m, prefill_tokens=1000) == 1000
    assert prefill_group_tokens(gptj, prefill_tokens=1000) == 1000
    ctx = {s.m for s in gemm_shapes(gpt2m, batch=8, beam=1, max_input_len=300,
                                    group_tokens=1000) if s.what == "context qkv"}
    assert ctx == {900, 600}  # 8 x 300 tokens as groups of 3, 3 and 2 sequences
    with pytest.raises(ValueError, match="prefill_tokens must be a positive"):
        prefill_group_tokens(gpt2m, prefill_tokens=-3)


def test_cli_requires_dimensions(capsys) -> None:
    with pytest.raises(SystemExit, match="give --model-dir, or all of --head-num"):
        main(["gemm-tune", "--batch-size", "2"])
    with pytest.raises(SystemExit, match="--batch-size must be >= 1"):
        main(["gemm-tune", "--batch-size", "0", "--head-num", "2"])
    with pytest.raises(SystemExit, match="--pipeline-para-size must be >= 1"):
        main(["gemm-tune", "--pipeline-para-size", "0", "--head-num", "2"])


def test_decode_rows_mirror_the_pipeline_split() -> None:
    """GptModel::decode_micro_batches / decode_steps_split: with P stages, no beam and at least P
    rows, runs of decode steps go as P micro-batches of rows [m * rows // P, (m+1) * rows // P);
    the first step and short runs keep all rows. gemm_shapes lists both, the lm_head's too."""
    one = ModelDims(hidden=1024, inter=4096, vocab=50257)
    pp2 = ModelDims(hidden=1024, inter=4096, vocab=50257, pipeline_para_size=2)
    pp4 = ModelDims(hidden=1024, inter=4096, vocab=50257, pipeline_para_size=4)
    assert decode_rows(8, 1, one) == [8]
    assert decode_rows(8, 1, pp2) == [4, 8]
    assert decode_rows(5, 1, pp2) == [2, 3, 5]
    assert decode_rows(6, 1, pp4) == [1, 2, 6]
    assert decode_rows(3, 1, pp4) == [3]  # fewer rows than stages: no split
    assert decode_rows(8, 2, pp2) == [8]  # beam search steps whole
    ms = {s.m for s in gemm_shapes(pp2, 5, 1, 16) if s.what == "decode qkv"}
    assert ms == {2, 3, 5}
    assert {s.m for s in gemm_shapes(pp2, 5, 1, 16) if s.transposed} >= {2, 3, 5}


def test_pipeline_size_reaches_the_dims() -> None:
    """--pipeline-para-size (FT's gpt_gemm has none; the stage count is a runtime choice) reaches
    ModelDims from the size arguments and from a checkpoint's config alike."""
    args = argparse.Namespace(model_dir=None, head_num=16, size_per_head=64, inter_size=4096,
                              vocab_size=50257, tensor_para_size=None, activation_type="gelu_tanh",
                              pipeline_para_size=2)
    assert dims_from_args(args) == ModelDims(1024, 4096, 50257, pipeline_para_size=2)
    cfg = GptConfig(head_num=16, size_per_head=64, inter_size=4096, vocab_size=50257,
                    num_layer=2, max_pos_seq_len=1024)
    assert ModelDims.from_config(cfg, None, 2).pipeline_para_size == 2
    assert ModelDims.from_config(cfg).pipeline_para_size == 1


def test_prompt_pass_rows_mirror_the_engine() -> None:
    """GptModel::prompt_graph_tokens: a one-group pass on one GPU past 8 tokens runs padded to a
    multiple of 16 up to 128 tokens and of 64 beyond (the GPU tests see these m in the plans);
    several groups, tensor parallelism and cuda_graphs=False keep exact counts."""
    one = ModelDims(hidden=1024, inter=4096, vocab=50257)
    tp2 = ModelDims(hidden=1024, inter=4096, vocab=50257, tensor_para_size=2)
    pp2 = ModelDims(hidden=1024, inter=4096, vocab=50257, pipeline_para_size=2)
    assert [prompt_graph_tokens(t, one) for t in (1, 8, 9, 16, 17, 128, 129, 640, 641, 4000)] \
        == [0, 0, 16, 16, 32, 128, 192, 640, 704, 4032]
    assert prompt_graph_tokens(100, tp2) == 0
    assert prompt_graph_tokens(100, pp2) == 0
    assert prompt_pass_rows([1000] * 4, 4096, one) == [4032]
    assert prompt_pass_rows([1000] * 4, 4096, tp2) == [4000]
    assert prompt_pass_rows([1000] * 4, 4096, pp2) == [4000]
    assert {s.m for s in gemm_shapes(pp2, 8, 1, 81) if s.what == "context qkv"} == {648}
    assert prompt_pass_rows([1000] * 4, 2048, one) == [2000, 2000]
    ms = {s.m for s in gemm_shapes(one, 8, 1, 81) if s.what == "context qkv"}
    assert ms == {704}  # 648 tokens
    # --prompt-rows covers the padded counts too: a 150-token pass runs at 192 rows, a 50-token
    # one at 64, outside the exact counts' buckets.
    for (lo, hi), padded in (((129, 176), 192), ((1, 50), 64)):
        ms = {s.m for s in gemm_shapes(one, 1, 1, 16, prompt_rows=(lo, hi))
              if s.what == "context ffn out"}
        assert padded in ms and padded not in row_buckets(lo, hi)
        assert set(row_buckets(lo, hi)) <= ms
    assert prompt_pass_rows([1000] * 4, 4096, one, cuda_graphs=False) == [4000]
    ms = {s.m for s in gemm_shapes(one, 1, 1, 16, prompt_rows=(129, 176), cuda_graphs=False)
          if s.what == "context ffn out"}
    assert ms == {16} | set(row_buckets(129, 176))


def test_group_tokens_override() -> None:
    dims = ModelDims(hidden=1024, inter=4096, vocab=50257)
    ms = {s.m for s in gemm_shapes(dims, 64, 1, 128, group_tokens=8192) if s.what == "context qkv"}
    assert ms == {8192}
    ms = {s.m for s in gemm_shapes(dims, 64, 1, 128, group_tokens=1000) if s.what == "context qkv"}
    assert ms == set(prefill_groups([128] * 64, 1000))
    for bad in (0, -5):
        with pytest.raises(ValueError, match="group_tokens must be >= 1"):
            gemm_shapes(dims, 64, 1, 128, group_tokens=bad)


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
    dims = ModelDims(hidden=1024, inter=4096, vocab=50257)
    ms = {s.m for s in gemm_shapes(dims, 8, 1, 80, prompt_rows=(256, 700))
          if s.what == "context ffn out"}
    assert ms == {640} | set(row_buckets(256, 700))
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


def test_dims_from_a_converted_checkpoint(tmp_path) -> None:
    """ModelDims.from_config takes the switches that decide the shapes from config.ini."""
    import transformers

    from warpformer.converters import convert
    from warpformer.weights import read_config

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
    d = ModelDims.from_config(read_config(tmp_path / "opt-wf"), tensor_para_size=2)
    assert (d.hidden, d.inter, d.vocab, d.tensor_para_size, d.word_embed_proj_dim) == \
        (64, 128, 300, 2, 32)
    assert (d.parallel_residual, d.activation, d.lm_head_bias, d.pre_layernorm) == \
        (False, "relu", False, False)
    d = ModelDims.from_config(read_config(tmp_path / "gptj-wf"))  # the checkpoint's TP size
    assert (d.hidden, d.inter, d.tensor_para_size, d.word_embed_proj_dim) == (64, 256, 2, 0)
    assert ModelDims.from_config(read_config(tmp_path / "gptj-wf"), 1).tensor_para_size == 1
    assert (d.parallel_residual, d.activation, d.lm_head_bias, d.pre_layernorm) == \
        (True, "gelu_tanh", True, True)

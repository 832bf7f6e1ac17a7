"""``examples/t5_generate.py`` on CPU (reference backend): a tiny random T5 and BART, converted
once; the printed outputs equal ``Seq2Seq.generate`` greedy and beam, batches split by
``-batch``, and bad input gets ``error: ...`` and exit status 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from _seq2seq import build_seq2seq, save_models, seq2seq_config_changes

from warpformer.converters import convert
from warpformer.seq2seq import Seq2Seq

ROOT = Path(__file__).resolve().parents[1]
INPUTS = [[5, 17, 42, 9, 33, 1], [7, 3, 1], [60, 61, 62, 11, 12, 13, 14, 1]]
N = 6


def _load_example():
    spec = importlib.util.spec_from_file_location("example_t5_generate",
                                                  ROOT / "examples" / "t5_generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5_generate")
    models = save_models(build_seq2seq, ["t5-small", "bart"], root, seq2seq_config_changes)
    ckpts = {name: convert(models[name][1], root / f"{name}-wf", 1, "fp32").output_dir
             for name in models}
    return dict(ckpts=ckpts, example=_load_example())


def _run(world, capsys, name, *argv):
    rc = world["example"].main(["--ckpt_path", str(world["ckpts"][name]), "--backend",
                                "reference", "-o", str(N), *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


@pytest.mark.parametrize("name", ["t5-small", "bart"])
@pytest.mark.parametrize("beam", [1, 3])
def test_outputs_equal_seq2seq_generate(world, capsys, name, beam):
    ids = [",".join(map(str, r)) for r in INPUTS]
    rc, lines, err = _run(world, capsys, name, "--input_ids", *ids, "-batch", "2", "-beam",
                          str(beam), "--len_penalty", "0.8", "-time")
    assert rc == 0, err
    model = Seq2Seq.from_pretrained(world["ckpts"][name], backend="reference", max_batch=3)
    options = dict(num_beams=beam, length_penalty=0.8) if beam > 1 else {}
    want = []
    for start in (0, 2):  # the example's batches of 2
        out = model.generate(INPUTS[start:start + 2], N, **options)
        want += [",".join(str(t) for t in row[0] if t not in model.end_ids) for row in out.tokens]
    assert lines == want
    assert "2 batches of <= 2" in err


def test_bad_input_is_an_error_not_a_traceback(world, capsys):
    rc, _, err = _run(world, capsys, "t5-small", "--input_ids", "5,x")
    assert rc == 2 and "error: --input_ids takes comma-separated integers" in err
    rc, _, err = _run(world, capsys, "t5-small", "--input_ids", "5,1", "-batch", "0")
    assert rc == 2 and "error: --batch_size must be >= 1, got 0" in err
    rc, _, err = _run(world, capsys, "t5-small", "--input_ids", "500,1")
    assert rc == 2 and "error:" in err and "500" in err
    rc, _, err = _run(world, capsys, "t5-small")
    assert rc == 2 and "error: give exactly one of --source and --input_ids" in err

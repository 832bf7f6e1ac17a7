"""LAMBADA harness on CPU: FT's splitting rule, accuracy counting, JSON output, the logits metric
and the ``warpformer lambada --test-hf`` path end to end on a tiny random model with a locally
built word-level tokenizer (reference backend)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer import lambada
from warpformer.cli import main as cli_main
from warpformer.converters import convert
from warpformer.demo import build_random_gpt2, default_dataset
from warpformer.gpt import GPT, GenerationOutput


# ---------------------------------------------------------------------------- splitting
@pytest.mark.parametrize("text, context, target", [
    ("The cat sat on the mat", "The cat sat on the mat".rsplit(" ", 1)[0], " mat"),
    ("He whispered her name.", "He whispered her", " name."),
    ('She said "goodbye"', "She said", ' "goodbye"'),
    ("one two  three\n", "one two ", " three"),
    ("Over there, by the well-worn path", "Over there, by the well-worn", " path"),
])
def test_split_at_last_space(text, context, target):
    assert lambada.split_text(text) == (context, target)


@pytest.mark.parametrize("text", ["single", "", "trailing   ", " leading"])
def test_split_needs_context_and_word(text):
    with pytest.raises(ValueError, match="no 'context last-word' split"):
        lambada.split_text(text)


def test_read_dataset(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a b c"}\n\n{"text": "d e"}\n{"text": "f g h i"}\n')
    s = lambada.read_dataset(p)
    assert [(x.index, x.context, x.target) for x in s] == [(0, "a b", " c"), (1, "d", " e"),
                                                           (2, "f g h", " i")]
    assert len(lambada.read_dataset(p, max_samples=2)) == 2
    p.write_text('{"text": "a b"}\n{"txt": "oops"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: expected a JSON object with a 'text'"):
        lambada.read_dataset(p)
    p.write_text('{"text": "nospace"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:1: text has no"):
        lambada.read_dataset(p)


def test_bundled_sample_is_lambada_format():
    samples = lambada.read_dataset(default_dataset())
    assert 150 <= len(samples) <= 250
    assert all(s.target.startswith(" ") and s.target[1:].isalpha() for s in samples)


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    texts = [json.loads(line)["text"] for line in default_dataset().read_text().splitlines()]
    lambada.build_word_tokenizer(texts, out)
    return transformers.AutoTokenizer.from_pretrained(out)


def test_multi_token_targets(word_tok):
    s = lambada.tokenize_samples([lambada.Sample(0, "The cat sat on the", " mat."),
                                  lambada.Sample(1, "She said", ' "hello"')], word_tok)
    assert len(s[0].target_ids) == 2 and word_tok.decode(s[0].target_ids[1:]) == "."
    assert len(s[1].target_ids) == 3
    assert word_tok.eos_token_id == 1 and word_tok.pad_token_id == 1


# ---------------------------------------------------------------------------- counting
class ScriptedGPT:
    """Duck-typed stand-in for GPT: returns scripted generations and logits."""

    end_id = 1

    def __init__(self, outputs: dict[tuple[int, ...], list[int]], vocab: int = 20) -> None:
        self.outputs, self.vocab, self.calls = outputs, vocab, []

    def generate(self, prompts, n):
        self.calls.append((len(prompts), n))
        toks = [[self.outputs[tuple(p)][:n]] for p in prompts]
        return GenerationOutput(torch.zeros(0), torch.zeros(0), torch.zeros(0), toks)

    def logits(self, seqs):
        out = torch.zeros(len(seqs), max(map(len, seqs)), self.vocab)
        for b, seq in enumerate(seqs):
            for ctx_len in range(1, len(seq) + 1):
                key = tuple(seq[:ctx_len])
                for prompt, toks in self.outputs.items():  # predict the scripted continuation
                    if key[: len(prompt)] == prompt and len(key) - len(prompt) < len(toks):
                        out[b, ctx_len - 1, toks[len(key) - len(prompt)]] = 5.0
        return out


def _sample(i, ctx, tgt):
    s = lambada.Sample(i, "c", " t")
    s.context_ids, s.target_ids = ctx, tgt
    return s


def test_model_protocol():
    # evaluate's model type: GPT and the stand-in have its members, a model without logits not.
    from warpformer.gpt import GPT

    assert isinstance(ScriptedGPT({}), lambada.LambadaModel)
    assert all(callable(getattr(GPT, m)) for m in ("generate", "logits"))
    assert isinstance(GPT.end_id, property)

    class NoLogits:
        end_id = 1

        def generate(self, prompts, n):
            return None

    assert not isinstance(NoLogits(), lambada.LambadaModel)


def test_accuracy_counting_and_batches():
    samples = [
        _sample(0, [2, 3], [4]),          # correct
        _sample(1, [5], [6, 7]),          # correct, two tokens
        _sample(2, [8, 9, 10], [11, 12]),  # second token wrong
        _sample(3, [13], [14]),           # ended early with end_id: wrong
        _sample(4, [15], [16]),           # correct; the extra generated token does not matter
    ]
    fake = ScriptedGPT({(2, 3): [4, 9], (5,): [6, 7], (8, 9, 10): [11, 2], (13,): [1],
                        (15,): [16, 16]})
    res = lambada.evaluate(fake, samples, batch_size=2, metric="both")
    assert fake.calls == [(2, 2), (2, 2), (1, 1)]  # each batch: its longest target
    assert (res.correct, res.total) == (3, 5)
    assert [r["correct"] for r in res.records] == [True, True, False, False, True]
    assert [r["generated_ids"] for r in res.records] == [[4], [6, 7], [11, 2], [1], [16]]
    assert res.logits_correct == 3
    assert [r["logits_correct"] for r in res.records] == [r["correct"] for r in res.records]
    report = lambada.format_report(res)
    assert "warpformer accuracy: 60.0000% (3/5)" in report
    assert re.search(r"warpformer logits accuracy: 60.0000% \(3/5\)\s+target ppl", report)


# ---------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """(HF dir with tokenizer, converted dir, dataset) for a tiny random GPT-2 whose dataset has
    known answers: some of the first 24 samples end with the model's own greedy next word."""
    root = tmp_path_factory.mktemp("lambada")
    hf_dir = build_random_gpt2(default_dataset(), root / "hf", layers=2, hidden=64, heads=2,
                               positions=128)
    convert(hf_dir, root / "wf", 1, "fp32")
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    gpt = GPT.from_pretrained(root / "wf", dtype=torch.float32, max_batch=8, max_seq_len=128,
                              backend="reference")
    contexts = [lambada.split_text(json.loads(line)["text"])[0]
                for line in default_dataset().read_text().splitlines()[:40]]
    lines, planted = [], []
    for i, ctx in enumerate(contexts):
        nxt = gpt.generate([tok.encode(ctx)], 1).tokens[0][0][0]
        word = tok.decode([nxt])
        if i < 24 and word.isalpha() and i % 2 == 0:
            lines.append(ctx + " " + word)
            planted.append(i)
        else:
            lines.append(ctx + " zzzunknownword")  # an <unk> target
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    return hf_dir, root / "wf" / "1-gpu", data, planted


def test_cli_lambada_test_hf_end_to_end(tiny_lm, tmp_path, capsys):
    hf_dir, ckpt, data, planted = tiny_lm
    out = tmp_path / "res.json"
    rc = cli_main(["lambada", "--checkpoint-path", str(ckpt), "--tokenizer-path", str(hf_dir),
                   "--dataset-path", str(data), "--batch-size", "4", "--test-hf",
                   "--output-path", str(out), "--dtype", "fp32", "--metric", "both",
                   "--backend", "reference", "--show-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert len(planted) >= 4
    acc = re.search(r"warpformer accuracy: (\d+\.\d{4})% \((\d+)/(\d+)\)\s+elapsed [\d.]+ s", text)
    assert acc and int(acc.group(3)) == 40
    n = int(acc.group(2))
    assert n >= len(planted)  # the planted answers are found (an <unk> target may match too)
    assert f"HF accuracy: {100 * n / 40:.4f}% ({n}/40)" in text
    assert "accuracy difference (warpformer - HF): +0.0000 points" in text
    assert "generated target tokens agree with HF: 100.0000% (40/40)" in text
    assert re.search(r"speedup over HF: [\d.]+x", text)
    assert re.search(r"warpformer logits accuracy: [\d.]+% \(\d+/40\)", text)
    assert re.search(r"HF logits accuracy: [\d.]+% \(\d+/40\)", text)
    result = json.loads(out.read_text())
    assert result["summary"]["correct"] == n and result["summary"]["total"] == 40
    assert result["summary"]["hf_correct"] == n and result["summary"]["agree"] == 40
    recs = result["samples"]
    assert len(recs) == 40 and set(recs[0]) >= {
        "index", "context", "target", "target_ids", "generated_ids", "generated_text",
        "correct", "hf_generated_ids", "hf_correct", "agree", "logits_correct", "target_nll",
        "hf_logits_correct"}
    assert all(r["logits_correct"] == r["correct"] for r in recs)  # greedy == teacher forcing
    assert all(recs[i]["correct"] for i in planted)


def test_in_flight_gives_the_same_records(tiny_lm, tmp_path, capsys):
    # The CLI's --in-flight reaches GPT.generate_batches and scores the same tokens as
    # batch-by-batch generate; the reference backend runs one batch at a time and says so.
    hf_dir, ckpt, data, _ = tiny_lm
    outs = {}
    for n in (1, 3):
        out = tmp_path / f"res{n}.json"
        rc = cli_main(["lambada", "--checkpoint-path", str(ckpt), "--tokenizer-path",
                       str(hf_dir), "--dataset-path", str(data), "--batch-size", "4",
                       "--output-path", str(out), "--dtype", "fp32", "--backend", "reference",
                       "--in-flight", str(n)])
        assert rc == 0
        text = capsys.readouterr().out
        assert "batches in flight" not in text
        outs[n] = json.loads(out.read_text())
    assert outs[3]["summary"]["in_flight"] == 1
    for key in ("correct", "total"):
        assert outs[3]["summary"][key] == outs[1]["summary"][key]
    assert [r["generated_ids"] for r in outs[3]["samples"]] == [
        r["generated_ids"] for r in outs[1]["samples"]]


def test_in_flight_errors():
    samples = [_sample(0, [2, 3], [4])]
    fake = ScriptedGPT({(2, 3): [4]})
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=r"in_flight must be an integer >= 1"):
            lambada.evaluate(fake, samples, in_flight=bad)
    with pytest.raises(ValueError, match=r"in_flight=2 needs a model with generate_batches "
                                         r"\(warpformer.GPT\); ScriptedGPT has none"):
        lambada.evaluate(fake, samples, in_flight=2)
    assert lambada.evaluate(fake, samples, in_flight=1).correct == 1


def test_in_flight_uses_generate_batches():
    # in_flight > 1 hands every batch, with its own token count, to generate_batches in one
    # call and scores what it yields; the report names the batches in flight.
    class Batched(ScriptedGPT):
        backend = "cuda"

        def generate_batches(self, batches, counts, *, in_flight):
            self.batched = (len(batches), list(counts), in_flight)
            for b, n in zip(batches, counts, strict=True):
                yield self.generate(b, n)

    samples = [_sample(0, [2, 3], [4]), _sample(1, [5], [6, 7]), _sample(2, [8], [9])]
    fake = Batched({(2, 3): [4, 9], (5,): [6, 7], (8,): [3]})
    res = lambada.evaluate(fake, samples, batch_size=2, in_flight=3)
    assert fake.batched == (2, [2, 1], 3)
    assert (res.correct, res.in_flight) == (2, 3)
    assert [r["generated_ids"] for r in res.records] == [[4], [6, 7], [3]]
    assert "(3 batches in flight)" in lambada.format_report(res)


def test_logits_metric_alone_and_nll_matches_hf(tiny_lm):
    hf_dir, ckpt, data, _ = tiny_lm
    hf = lambada.load_hf_model(hf_dir, torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    samples = lambada.tokenize_samples(lambada.read_dataset(data, max_samples=10), tok)
    gpt = GPT.from_pretrained(ckpt, dtype=torch.float32, max_batch=3, max_seq_len=128,
                              backend="reference")
    res = lambada.evaluate(gpt, samples, batch_size=3, metric="logits", hf_model=hf)
    assert res.correct is None and res.hf_correct is None  # no generation
    assert res.logits_correct == res.hf_logits_correct
    assert res.logits_nll == pytest.approx(res.hf_logits_nll, rel=1e-4)
    assert "warpformer accuracy" not in lambada.format_report(res)


def test_cli_errors_are_reported(tiny_lm, tmp_path, capsys):
    hf_dir, ckpt, data, _ = tiny_lm
    rc = cli_main(["lambada", "--checkpoint-path", str(ckpt), "--tokenizer-path", str(hf_dir),
                   "--dataset-path", str(data), "--batch-size", "0", "--backend", "reference"])
    assert rc == 2 and "batch_size must be >= 1" in capsys.readouterr().err
    (tmp_path / "tok").mkdir()
    for f in Path(hf_dir).glob("tok*"):
        (tmp_path / "tok" / f.name).write_bytes(f.read_bytes())
    rc = cli_main(["lambada", "--checkpoint-path", str(ckpt), "--tokenizer-path",
                   str(tmp_path / "tok"), "--dataset-path", str(data), "--test-hf",
                   "--backend", "reference", "--max-samples", "2"])
    assert rc == 2 and "--test-hf needs a HF checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("count", ["-1", "0"])
def test_cli_refuses_a_max_samples_below_one(tiny_lm, capsys, count):
    # -1 used to read one sample and report it as the whole evaluation.
    hf_dir, ckpt, data, _ = tiny_lm
    rc = cli_main(["lambada", "--checkpoint-path", str(ckpt), "--tokenizer-path", str(hf_dir),
                   "--dataset-path", str(data), "--max-samples", count, "--backend", "reference"])
    err = capsys.readouterr().err
    assert rc == 2 and f"max_samples (--max-samples) must be an integer >= 1, got {count}" in err
    with pytest.raises(ValueError, match="max_samples"):
        lambada.read_dataset(data, int(count))


def test_cli_names_a_missing_or_empty_tokenizer_folder(tiny_lm, tmp_path, capsys):
    _, ckpt, data, _ = tiny_lm
    args = ["lambada", "--checkpoint-path", str(ckpt), "--dataset-path", str(data),
            "--backend", "reference", "--max-samples", "2", "--tokenizer-path"]
    rc = cli_main(args + [str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert rc == 2 and f"error: --tokenizer-path {tmp_path / 'nowhere'} does not exist" in err
    assert "Traceback" not in err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    rc = cli_main(args + [str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert rc == 2 and "--tokenizer-path" in err and "holds no tokenizer files" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("not json")
    rc = cli_main(args + [str(broken)])
    err = capsys.readouterr().err
    assert rc == 2 and "transformers cannot load its tokenizer" in err


def test_only_rank_zero_prints(tiny_lm, monkeypatch, capsys, tmp_path):
    hf_dir, ckpt, data, _ = tiny_lm
    monkeypatch.setenv("RANK", "1")
    res = lambada.run(ckpt, hf_dir, data, batch_size=4, max_samples=4, backend="reference",
                      dtype="fp32", output_path=tmp_path / "x.json")
    assert res.total == 4 and capsys.readouterr().out == ""
    assert not (tmp_path / "x.json").exists()

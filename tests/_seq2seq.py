"""Helpers shared by the encoder-decoder parity tests (T5 and BART families)."""

from __future__ import annotations

import configparser
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers


def close(actual: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor | None = None
          ) -> None:
    """fp32 equality up to summation order: 2e-5 of the largest magnitude of ``scale`` (default
    ``expected``; a row compared alone is judged on its whole batch's scale)."""
    top = float((expected if scale is None else scale).abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=2e-5 * top + 1e-6)


def clear_prefix(scores: list[torch.Tensor], row: int, margin: float = 1e-3) -> int:
    """Steps of HF's greedy run before the first whose top-1 / top-2 gap is below ``margin``."""
    for step, s in enumerate(scores):
        top = s[row].float().topk(2).values
        if float(top[0] - top[1]) < margin:
            return step + 1  # this token may differ; nothing after it is comparable
    return len(scores)


def edit_tensors(path: Path, edit) -> None:
    """Apply ``edit(state_dict)`` to ``path/model.safetensors`` in place."""
    from safetensors.torch import load_file, save_file

    sd = load_file(path / "model.safetensors")
    edit(sd)
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})


def converter(models: dict, root: Path, convert) -> Callable[..., Path]:
    """``get(name, tp, data_type="fp32")``: ``models[name][1]`` converted (once) under ``root``."""
    cache: dict[tuple[str, int, str], Path] = {}

    def get(name: str, tp: int, data_type: str = "fp32") -> Path:
        key = (name, tp, data_type)
        if key not in cache:
            cache[key] = convert(models[name][1], root / f"{name}-{data_type}", tp,
                                 data_type).output_dir
        return cache[key]

    return get


def check_encoder_decoder(model, ref, ids: torch.Tensor, mask: torch.Tensor, seed: int = 4
                          ) -> None:
    """Encoder output and teacher-forced decoder logits of ``ref`` equal HF ``model``'s for
    right-padded ``ids`` ``[B, S]`` / ``mask``; each ragged row equals the row run alone."""
    lengths = mask.sum(1)
    vocab = model.config.vocab_size
    dec = torch.randint(0, vocab, (ids.shape[0], 5), generator=torch.Generator().manual_seed(seed))
    dec[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        hf_enc = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        hf_logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    enc = ref.encode(ids, lengths)
    close(enc, hf_enc * mask[..., None])
    close(ref.decoder_logits(enc, lengths, dec), hf_logits)
    for row, n in enumerate(lengths.tolist()):
        alone = ref.encode(ids[row:row + 1, :n])
        close(enc[row:row + 1, :n], alone, enc)
        close(ref.decoder_logits(alone, None, dec[row:row + 1]), hf_logits[row:row + 1],
              hf_logits)


def check_greedy(model, ref, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                 **generate_options) -> None:
    """``ref``'s greedy tokens equal HF's up to the first step whose top-1 margin is below 1e-3
    (:func:`clear_prefix`), and each row run alone gives the same tokens."""
    lengths = mask.sum(1)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, num_beams=1, min_length=0, output_scores=True,
                             return_dict_in_generate=True, **generate_options)
    hf_tokens = out.sequences[:, 1:]
    tokens, counts = ref.generate_greedy(ids, lengths, new_tokens)
    for row in range(ids.shape[0]):
        n = min(clear_prefix(out.scores, row), int(counts[row]))
        assert n >= 1
        assert tokens[row, :n].tolist() == hf_tokens[row, :n].tolist(), row
        alone, count = ref.generate_greedy(ids[row:row + 1, :lengths[row]], None, new_tokens)
        assert alone[0].tolist() == tokens[row].tolist() and int(count[0]) == int(counts[row])


def edit_json(path: Path, change: dict) -> None:
    """Set (``None``: delete) keys of ``path/config.json``."""
    cfg = json.loads((path / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def edit_ini(path: Path, sections: str, key: str, value: str | None) -> None:
    """Set (``None``: delete) ``key`` in each comma-separated section of ``path/config.ini``."""
    ini = configparser.ConfigParser()
    ini.read(path / "config.ini")
    for name in sections.split(","):
        if value is None:
            del ini[name][key]
        else:
            ini[name][key] = value
    with open(path / "config.ini", "w") as f:
        ini.write(f)


def save_models(build: Callable[[str], Any], names: list[str], root: Path,
                config_changes: Callable[[str], dict] = lambda name: {}) -> dict:
    """``{name: (build(name), checkpoint dir)}``, each saved under ``root / name`` (HF's
    warnings silenced) with ``config_changes(name)`` applied to its ``config.json``."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    out = {}
    try:
        for name in names:
            model, path = build(name), root / name
            model.save_pretrained(path)
            edit_json(path, config_changes(name))
            out[name] = (model, path)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return out

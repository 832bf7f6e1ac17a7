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


# ----------------------------------------------------------------------------- tiny models
# Tiny random models of each encoder-decoder variant (fp32, eager attention): the shapes of
# tests/test_seq2seq_api.py, a name per variant, HF's own classes.
T5_SHAPE = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=40, num_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=12,
                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
BART_SHAPE = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=40,
                  decoder_ffn_dim=48, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
                  eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
# name -> (HF class prefix, config overrides)
SEQ2SEQ_VARIANTS: dict[str, tuple[str, dict]] = {
    "t5-small": ("T5", dict(feed_forward_proj="relu")),  # tied head, rescaled by d_model^-0.5
    "t5-v1_1": ("T5", dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "mt5": ("MT5", dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "ul2": ("T5", dict(feed_forward_proj="gated-silu", num_decoder_layers=3,
                       tie_word_embeddings=False)),
    "bart": ("Bart", dict(decoder_layers=3)),  # post-LN
    "mbart": ("MBart", dict(scale_embedding=True, activation_function="relu")),  # pre-LN
}


def is_bart(name: str) -> bool:
    return SEQ2SEQ_VARIANTS[name][0].endswith("Bart")


def seq2seq_config_changes(name: str) -> dict:
    """``config.json`` keys a hub folder of ``name`` has that HF 5 does not write (an untied T5
    head)."""
    kw = SEQ2SEQ_VARIANTS[name][1]
    return {"tie_word_embeddings": False} if kw.get("tie_word_embeddings") is False else {}


def build_seq2seq(name: str, end_boost: float = 0.0, seed: int = 1
                  ) -> transformers.PreTrainedModel:
    """A tiny random HF model of variant ``name``. ``end_boost`` > 0 scales up the head's
    end-token row so that sequences end at various lengths (beam hypotheses finish)."""
    from _models import randomize

    kind, kw = SEQ2SEQ_VARIANTS[name]
    cfg = {**(BART_SHAPE if is_bart(name) else T5_SHAPE), **kw}
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(
        getattr(transformers, f"{kind}Config")(**cfg))
    if cfg.get("tie_word_embeddings") is False:  # transformers 5 ties every T5 head
        model.lm_head.weight = torch.nn.Parameter(torch.empty(cfg["vocab_size"], cfg["d_model"]))
    model.config._attn_implementation = "eager"
    model = randomize(model, seed=seed + list(SEQ2SEQ_VARIANTS).index(name))  # mT5 != v1.1
    with torch.no_grad():
        if is_bart(name):
            # randomize's biases (std 0.5) make every position's output nearly the same
            # token; smaller ones keep the outputs input-dependent
            for pname, p in model.named_parameters():
                if pname.endswith(".bias") and "norm" not in pname:
                    p.mul_(0.1)
            # a buffer, which randomize leaves at zero
            model.final_logits_bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))
        if end_boost:
            head = model.lm_head.weight
            head[cfg["eos_token_id"]] *= 1.0 + end_boost
    return model


def seq2seq_inputs(name: str, lengths: list[int], seed: int = 3
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded encoder ids ``[B, max(lengths)]`` (BART rows end with </s>, padded with
    its pad id; T5 rows padded with 0) and the attention mask."""
    lens = torch.tensor(lengths)
    S, vocab = max(lengths), SEQ2SEQ_VARIANTS[name][1].get("vocab_size", 96)
    ids = torch.randint(3, vocab, (len(lengths), S), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(S)[None, :] < lens[:, None]).long()
    if is_bart(name):
        ids[torch.arange(len(lengths)), lens - 1] = BART_SHAPE["eos_token_id"]
        return ids * mask + BART_SHAPE["pad_token_id"] * (1 - mask), mask
    return ids * mask, mask


def hf_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, **options):
    """HF ``generate`` with every default processor of these configs off (greedy unless
    ``options`` say otherwise); ``return_dict_in_generate`` with scores."""
    kw = dict(max_new_tokens=new_tokens, do_sample=False, num_beams=1, min_length=0,
              no_repeat_ngram_size=0, forced_bos_token_id=None, forced_eos_token_id=None,
              early_stopping=False, output_scores=True, return_dict_in_generate=True,
              use_cache=False)  # HF's cache mis-sizes num_decoder_layers != num_layers (UL2)
    kw.update(options)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, **kw)

"""Loading a HF tokenizer for the command-line tools, with errors that name the argument.

``transformers.AutoTokenizer.from_pretrained`` answers a missing folder, or one without tokenizer
files, with a long traceback (or, for a folder holding only a model, a hub lookup); the CLI's
subcommands call :func:`load_tokenizer` instead, which checks the folder first and raises
``ValueError`` naming the argument and what a tokenizer folder holds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import transformers

__all__ = ["TOKENIZER_FILES", "has_tokenizer_files", "load_tokenizer"]

# Any one of these makes a folder loadable by AutoTokenizer (fast tokenizers, GPT-2's BPE pair,
# sentencepiece models, or a config naming the tokenizer class with its vocabulary beside it).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "vocab.txt", "tokenizer_config.json")


def has_tokenizer_files(path: str | os.PathLike[str]) -> bool:
    """Whether the folder ``path`` holds any of :data:`TOKENIZER_FILES`."""
    root = Path(path)
    return root.is_dir() and any((root / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: str | os.PathLike[str], argument: str
                   ) -> transformers.PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(path)`` from a local folder only.

    Raises ``ValueError`` naming ``argument`` (e.g. ``"--tokenizer-path"``) when the folder is
    missing, holds no tokenizer files, or transformers cannot load them.
    """
    import transformers

    root = Path(path)
    if not root.exists():
        raise ValueError(f"{argument} {root} does not exist")
    if not root.is_dir():
        raise ValueError(f"{argument} {root} is not a folder (a HF tokenizer folder is expected)")
    if not has_tokenizer_files(root):
        raise ValueError(f"{argument} {root} holds no tokenizer files (one of "
                         f"{', '.join(TOKENIZER_FILES)}); save one there with "
                         "tokenizer.save_pretrained() or pass a folder that has one")
    try:
        return transformers.AutoTokenizer.from_pretrained(root, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{argument} {root}: transformers cannot load its tokenizer: "
                         f"{first}") from None

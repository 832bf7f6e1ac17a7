"""``python -m warpformer.converters --input-dir DIR --output-dir OUT --tensor-para-size N``."""

from __future__ import annotations

import sys

from warpformer.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))

"""Generate text with warpformer.GPT, with FasterTransformer's ``multi_gpu_gpt_example.py`` flags.

    python examples/generate.py --ckpt_path OUT/1-gpu --tokenizer_path HF_DIR \
        --sample_input_file prompts.txt --output_len 64 --top_p 0.9 --temperature 0.8
    python examples/generate.py --ckpt_path OUT/1-gpu --beam_width 4 --len_penalty 1.0
    python examples/generate.py --ckpt_path HF_DIR --prompt "In the beginning" --stream
    torchrun --nproc_per_node 2 examples/generate.py --ckpt_path OUT/2-gpu --tensor_para_size 2

A thin wrapper: ``warpformer generate`` (:mod:`warpformer.generate_cli`) does the work, with the
same options under FT's names here (``--ckpt_path`` = ``--model``, ``--output_len`` =
``--max-new-tokens``, ``--beam_width`` = ``--num-beams``, ``--len_penalty``,
``--beam_search_diversity_rate``, ``--random_seed``, ``--max_batch_size``,
``--sample_input_file``/``--sample_output_file``; the rest with underscores: ``--top_k``,
``--input_ids``, ...; ``--help`` lists them). ``--ckpt_path`` is a converted folder or a HF
checkpoint (converted once into the cache).

Prompts: with a tokenizer (``--tokenizer_path``, or the HF checkpoint's own),
``--sample_input_file`` holds one text prompt per line; without one it holds comma-separated token
ids per line (FT's ``start_ids.csv``); without a file the prompts come from
``--prompt``/``--input_ids`` or stdin.
As in FT, ``--top_k 1 --top_p 0`` (the defaults) mean greedy decoding; any other top_k/top_p
samples, seeded by ``--random_seed`` (default 0). The output is FT-style labelled lines
(``--output_format`` text, ids or jsonl for others).
"""

from __future__ import annotations

import sys

from warpformer.generate_cli import main as _main


def main(argv: list[str] | None = None) -> int:
    """Run the example on ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    return _main(argv, ft_names=True, prog="examples/generate.py",
                 description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())

"""LAMBADA with FasterTransformer's ``lambada_task_example.py`` flags, mapped onto
``warpformer.lambada`` (same method: split at the last space, greedy decoding of the batch's
longest target, correct iff every target token matches).

    python examples/lambada.py --checkpoint_path OUT/1-gpu --tokenizer_path HF_DIR \
        --lambada_path lambada_test.jsonl --batch_size 8 --data_type fp16 --test_hf
    torchrun --nproc_per_node 2 examples/lambada.py --checkpoint_path OUT/2-gpu \
        --tokenizer_path HF_DIR --lambada_path lambada_test.jsonl --tensor_para_size 2
"""

from __future__ import annotations

import argparse
import sys

import warpformer  # noqa: F401
from warpformer import lambada


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint_path", required=True, help="converted <tp>-gpu directory")
    ap.add_argument("--tokenizer_path", required=True, help="HF tokenizer folder")
    ap.add_argument("--lambada_path", required=True, help="LAMBADA-format JSONL")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--data_type", choices=("fp32", "fp16", "bf16"), default="fp16")
    ap.add_argument("--tensor_para_size", type=int, default=1)
    ap.add_argument("--pipeline_para_size", type=int, default=1)
    ap.add_argument("--output_path", help="per-sample JSON results")
    ap.add_argument("--test_hf", action="store_true", help="compare with HF transformers")
    ap.add_argument("--hf_model_path", help="HF checkpoint for --test_hf (default: tokenizer)")
    ap.add_argument("--show_progress", action="store_true")
    ap.add_argument("--metric", choices=("generate", "logits", "both"), default="generate")
    ap.add_argument("--max_samples", type=int)
    ap.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto")
    args = ap.parse_args(argv)
    lambada.run(args.checkpoint_path, args.tokenizer_path, args.lambada_path,
                batch_size=args.batch_size, test_hf=args.test_hf,
                hf_model_path=args.hf_model_path, output_path=args.output_path,
                show_progress=args.show_progress, metric=args.metric, dtype=args.data_type,
                max_samples=args.max_samples, backend=args.backend,
                tensor_para_size=args.tensor_para_size,
                pipeline_para_size=args.pipeline_para_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())

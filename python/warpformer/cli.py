"""The ``warpformer`` command line: ``warpformer <subcommand> ...``.

Subcommands live in :data:`SUBCOMMANDS` as ``name -> (help, add_args, run)``: ``add_args`` fills
an ``argparse`` parser, ``run`` takes the parsed namespace and returns an exit code. Add one by
adding an entry (``lambada``, ``gemm-tune`` plug in the same way). Every option of every
subcommand has a help string (``tests/test_cli_help.py`` checks).

- ``convert``: a HF or Megatron checkpoint -> warpformer's sharded format.
- ``generate``: prompts in, text (or token ids) out, from a HF or converted checkpoint
  (:mod:`warpformer.generate_cli`).
- ``gemm-tune``: a cuBLASLt tuning file for a model's GEMM shapes.
- ``lambada``: LAMBADA accuracy with FT's method, optionally against HF.
- ``demo``: the main job end to end on a fresh machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

__all__ = ["SUBCOMMANDS", "main", "build_parser"]


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-dir", "-i", required=True,
                   help="HF checkpoint folder (config.json + weights) or Megatron checkpoint")
    p.add_argument("--output-dir", "-o", required=True,
                   help="output folder; the result goes to OUTPUT_DIR/<N>-gpu")
    p.add_argument("--tensor-para-size", "-tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size to split for (default 1)")
    p.add_argument("--data-type", "-dt", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="on-disk weight type (default fp32)")
    p.add_argument("--processes", "-p", type=int, default=1, metavar="P",
                   help="worker processes (default 1)")
    p.add_argument("--force", action="store_true", help="replace an existing OUTPUT_DIR/<N>-gpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--allow-unsafe-pickle", action="store_true",
                   help="Megatron: allow arbitrary pickled objects (only for trusted files)")
    p.add_argument("--weight-quant", choices=("int8", "int4"), default=None,
                   help="GPT family: weight-only quantize the layers' linear weights: int8 per "
                        "output channel, int4 in groups along the input (needs --data-type fp16 "
                        "or bf16)")
    p.add_argument("--quant-group-size", type=int, default=None, metavar="G",
                   help="int4: input rows per scale, even, dividing each rank's width "
                        "(default 128)")
    p.add_argument("--quant-asymmetric", action="store_true",
                   help="int4: asymmetric, with a zero point per group (default symmetric)")
    p.add_argument("--quant-lm-head", action="store_true",
                   help="quantize the lm_head too (default: it stays in --data-type)")


def _quant_scheme(args: argparse.Namespace):
    """The :class:`~warpformer.config.QuantScheme` the convert flags ask for, or ``None``."""
    from warpformer.config import QuantScheme
    from warpformer.converters import ConversionError

    if args.weight_quant is None:
        given = [flag for flag, value in (("--quant-group-size", args.quant_group_size is not None),
                                          ("--quant-asymmetric", args.quant_asymmetric),
                                          ("--quant-lm-head", args.quant_lm_head)) if value]
        if given:
            raise ConversionError(f"{', '.join(given)} needs --weight-quant int8 or int4")
        return None
    return QuantScheme(args.weight_quant, args.quant_group_size, args.quant_asymmetric,
                       args.quant_lm_head)


def _convert_run(args: argparse.Namespace) -> int:
    from warpformer.converters import convert

    summary = convert(args.input_dir, args.output_dir, args.tensor_para_size, args.data_type,
                      args.processes, args.force, progress=not args.no_progress,
                      allow_unsafe_pickle=args.allow_unsafe_pickle,
                      weight_quant=_quant_scheme(args))
    print(summary)
    return 0


def _gemm_tune_args(p: argparse.ArgumentParser) -> None:
    from warpformer.gemm_tune import add_arguments

    add_arguments(p)


def _gemm_tune_run(args: argparse.Namespace) -> int:
    from warpformer.gemm_tune import run

    return run(args)


def _user_errors(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Print ``error: ...`` and return 2 for ValueError (bad arguments, data or files)."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (ValueError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return wrapped


def _lambada_args(p: argparse.ArgumentParser) -> None:
    from warpformer.lambada import add_args

    add_args(p)


def _lambada_run(args: argparse.Namespace) -> int:
    from warpformer.lambada import main_from_args

    return main_from_args(args)


def _generate_args(p: argparse.ArgumentParser) -> None:
    from warpformer.generate_cli import add_args

    add_args(p)


def _generate_run(args: argparse.Namespace) -> int:
    from warpformer.generate_cli import run

    return run(args)


def _demo_args(p: argparse.ArgumentParser) -> None:
    from warpformer.demo import add_args

    add_args(p)


def _demo_run(args: argparse.Namespace) -> int:
    from warpformer.demo import main_from_args

    return main_from_args(args)


SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                             Callable[[argparse.Namespace], int]]] = {
    "convert": ("convert a HF or Megatron checkpoint to warpformer's sharded format",
                _convert_args, _convert_run),
    "generate": ("prompts in, generated text (or token ids) out, from a HF or converted "
                 "checkpoint", _generate_args, _user_errors(_generate_run)),
    "gemm-tune": ("time cuBLASLt algorithms for a model's GEMM shapes and write a tuning file",
                  _gemm_tune_args, _gemm_tune_run),
    "lambada": ("LAMBADA last-word accuracy with FT's method (optionally against HF)",
                _lambada_args, _user_errors(_lambada_run)),
    "demo": ("the main job on a fresh machine: random or given model -> convert -> generate -> "
             "LAMBADA vs HF", _demo_args, _user_errors(_demo_run)),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per :data:`SUBCOMMANDS` entry."""
    parser = argparse.ArgumentParser(
        prog="warpformer", description="warpformer: transformer inference engine tools")
    subs = parser.add_subparsers(dest="command", required=True, metavar="<subcommand>")
    for name, (help_text, add_args, run) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        add_args(sub)
        sub.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2: usage or user error, printed as ``error: ...``)."""
    args = build_parser().parse_args(argv)
    from warpformer.config import ConfigError
    from warpformer.converters import ConversionError
    from warpformer.weights import WeightFileError

    try:
        return args._run(args)
    except (ConversionError, ConfigError, WeightFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of our output left (`warpformer generate ... | head`): stop quietly as Unix
        # tools do, and keep Python's exit-time flush of stdout from raising again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is no file (replaced in-process)
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())

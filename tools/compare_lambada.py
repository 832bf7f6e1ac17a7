"""Compare the per-sample predictions of two `warpformer lambada --output-path` files (e.g. one
GPU against `mpirun -n 2 ... --tensor-para-size 2`). Exit 1 if any sample differs."""

import json
import sys


def main(a_path: str, b_path: str) -> int:
    a = json.load(open(a_path))["samples"]
    b = json.load(open(b_path))["samples"]
    keys = [k for k in a[0] if k not in ("index", "context", "target")]
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if
            any(x[k] != y[k] for k in keys)]
    print(f"{len(a)} samples compared on {keys}: {len(a) - len(diff)} identical, "
          f"{len(diff)} differ" + (f" (first: {diff[:5]})" if diff else ""))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

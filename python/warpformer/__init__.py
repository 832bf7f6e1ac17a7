"""warpformer: a C++/CUDA transformer inference engine shipped as a PyTorch extension.

Importing the package loads the compiled extension ``warpformer._C``, which registers the ops
under ``torch.ops.warpformer`` and the classes under ``torch.classes.warpformer``, and registers
the fake (meta) implementations that let ``torch.compile`` trace the ops.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch and the CUDA libraries _C links against)

try:
    from . import _C  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "warpformer._C could not be loaded: build the extension with "
        "`pip install --no-build-isolation -e .` against the torch you import "
        f"(torch {torch.__version__}). Original error: {exc}"
    ) from exc

# fake (meta) implementations of the ops
from . import _ops, _ops_attention, _ops_beam, _ops_sampling  # noqa: E402,F401
from .config import QuantScheme  # noqa: E402
from .gpt import GPT, GenerationOutput  # noqa: E402
from .seq2seq import Seq2Seq  # noqa: E402
from .session import GenerationSession  # noqa: E402

T5 = Bart = Seq2Seq  # one class serves both families (the converted config says which)

__version__ = "0.1.0"

__all__ = ["GPT", "Bart", "GenerationOutput", "GenerationSession", "QuantScheme", "Seq2Seq", "T5",
           "__version__"]

"""Engine options: the run-time choices a user makes when building an engine instance.

They are keywords of :meth:`warpformer.GPT.from_pretrained` (and of
:func:`warpformer.models.gpt.build_gpt_model`), checked here, and reach the C++ class as the
``options`` JSON of its constructor (``csrc/torch/model_options.h``) with the instance's limits
and place in the parallel grid. Nothing below ``csrc/torch`` reads the environment; the one
environment fallback left is ``WARPFORMER_GEMM_CONFIG`` for ``gemm_config``.

==================  ========  ==============================================================
keyword             default   meaning
==================  ========  ==============================================================
``cuda_graphs``     True      replay decode steps (and one-GPU prompt passes) from CUDA graphs;
                              False launches every kernel eagerly (profilers, old drivers)
``prefill_tokens``  None      tokens per prefill group (the activation buffer holds one
                              group); None: 2,048, or 4,096 where a group's activations fit
                              64 MiB. Every rank of a parallel group must use the same value
``peer_allreduce``  True      tensor parallelism: the one-shot NVLink all-reduce for messages
                              up to 1 MiB where every rank's GPUs allow it; False: NCCL only
``gemm_config``     None      a ``warpformer gemm-tune`` file of cuBLASLt algorithms; None:
                              ``$WARPFORMER_GEMM_CONFIG`` if set, else cuBLASLt's heuristics
==================  ========  ==============================================================
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["EngineOptions", "model_options_json"]


@dataclass(frozen=True)
class EngineOptions:
    """The options of the module's table; ``ValueError`` naming the keyword for a bad value."""

    cuda_graphs: bool = True
    prefill_tokens: int | None = None
    peer_allreduce: bool = True
    gemm_config: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        for name in ("cuda_graphs", "peer_allreduce"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        n = self.prefill_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                              or not 1 <= n <= 2**31 - 1):
            raise ValueError(f"prefill_tokens must be None or a number of tokens in "
                             f"[1, 2^31 - 1], got {n!r}")
        if self.gemm_config is not None and not isinstance(self.gemm_config, (str, os.PathLike)):
            raise ValueError(f"gemm_config must be a path or None, got {self.gemm_config!r}")


def model_options_json(options: EngineOptions, *, max_batch: int, max_seq_len: int, dtype: str,
                       tensor_para_rank: int = 0, pipeline_para_size: int = 1,
                       pipeline_para_rank: int = 0) -> str:
    """The ``options`` argument of ``torch.classes.warpformer.GptModel``: ``options`` (all but
    ``peer_allreduce``, which the communicators take) with the instance's limits, dtype
    (``"fp32"``/``"fp16"``/``"bf16"``) and place in the parallel grid."""
    return json.dumps({
        "max_batch": max_batch, "max_seq_len": max_seq_len, "dtype": dtype,
        "tensor_para_rank": tensor_para_rank, "pipeline_para_size": pipeline_para_size,
        "pipeline_para_rank": pipeline_para_rank,
        "gemm_config": os.fspath(options.gemm_config) if options.gemm_config else "",
        "cuda_graphs": options.cuda_graphs, "prefill_tokens": options.prefill_tokens or 0,
    }, sort_keys=True)

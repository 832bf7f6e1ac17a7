"""Cross-rank agreement for :mod:`warpformer.distributed`: every rank publishes a small status
report over the pre-NCCL rendezvous and reads everyone's (:func:`_agree`), and the reports are
turned into the failure messages every rank raises alike: failed or silent ranks grouped by
message (:func:`_failures`, :func:`_group_lines`) and checkpoint mismatches
(:func:`describe_checkpoint`, :func:`_checkpoint_problems`).

The barriers built on these (``checkpoint_barrier``, the preflight check) live in
:mod:`warpformer.distributed`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from . import _rendezvous as _rdv
from ._launch import RankInfo
from ._rendezvous import Rendezvous


@dataclass
class _Report:
    ok: bool
    message: str
    host: str
    extra: dict[str, Any] | None


def _agree(info: RankInfo, transport: Rendezvous, key: str, ok: bool, message: str,
           extra: dict[str, Any] | None, timeout_s: float) -> dict[int, _Report]:
    """Every rank publishes (ok, message, extra) and reads everyone's, until ``timeout_s``."""
    payload = {"ok": bool(ok), "message": str(message), "host": info.host, "extra": extra}
    everyone = list(range(info.world_size))
    transport.put(key, json.dumps(payload).encode(), everyone)
    deadline = time.monotonic() + timeout_s
    raw = transport.wait_all(key, everyone, deadline)
    reports = {r: _Report(**json.loads(v)) for r, v in raw.items()}
    # The host waits for those who reported to finish reading; the rest have already left.
    grace = min(timeout_s, _rdv.LINGER_MAX_S / 3)
    transport.linger(key, len(reports), max(deadline, time.monotonic() + grace))
    return reports


def _next_seq(transport: Rendezvous) -> int:
    seq = getattr(transport, "_wf_seq", 0) + 1
    transport._wf_seq = seq  # type: ignore[attr-defined]
    return seq


def _group_lines(failures: dict[int, tuple[str | None, str]]) -> list[str]:
    """``{rank: (host, message)}`` -> lines, ranks with the same message merged."""
    by_message: dict[str, list[tuple[int, str | None]]] = {}
    for rank, (host, message) in sorted(failures.items()):
        by_message.setdefault(message, []).append((rank, host))
    lines = []
    for message, members in by_message.items():
        ranks = [r for r, _ in members]
        hosts = sorted({h for _, h in members if h})
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
        if hosts:
            label += f" (host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})"
        lines.append(f"  {label}: {message}")
    return lines


def _ranges(ranks: list[int]) -> str:
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None], strict=True):
        if cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts)


def _failures(info: RankInfo, reports: dict[int, _Report],
              timeout_s: float) -> dict[int, tuple[str | None, str]]:
    out: dict[int, tuple[str | None, str]] = {
        r: (rep.host, rep.message) for r, rep in reports.items() if not rep.ok}
    for r in range(info.world_size):
        if r not in reports:
            out[r] = (None, f"did not report within {timeout_s:g} s (crashed, hung, or still "
                            "busy; see its log)")
    return out


_CHECKPOINT_KEYS = ("model_name", "model_variant", "num_layer", "head_num", "size_per_head",
                    "inter_size", "vocab_size", "weight_data_type")


def describe_checkpoint(config: Any, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What :func:`warpformer.distributed.checkpoint_barrier` compares across ranks: the
    converted dir's ``tensor_para_size``, model name and shape (from a ``GptConfig``), and its
    path."""
    out = {k: getattr(config, k) for k in ("tensor_para_size", *_CHECKPOINT_KEYS)}
    out["path"] = str(path) if path is not None else None
    return out


def _checkpoint_problems(info: RankInfo, reports: dict[int, _Report]) -> list[str]:
    seen = {r: rep.extra for r, rep in sorted(reports.items()) if rep.ok and rep.extra}
    tp = info.tensor_para_size
    wrong = {r: (None, f"loaded {c.get('path')}, converted for tensor_para_size "
                       f"{c.get('tensor_para_size')}, but tensor_para_size {tp} was requested: "
                       f"use the {tp}-gpu directory (convert with --tensor_para_size {tp})")
             for r, c in seen.items() if c.get("tensor_para_size") != tp}
    problems = _group_lines(wrong)
    differ = [k for k in _CHECKPOINT_KEYS if len({str(c.get(k)) for c in seen.values()}) > 1]
    if differ:
        problems.append(f"  ranks loaded different models ({', '.join(differ)} differ):")
        models = {r: (None, ", ".join(f"{k}={c.get(k)}" for k in differ)
                      + f" from {c.get('path')}") for r, c in seen.items()}
        problems.extend("  " + line for line in _group_lines(models))
    return problems

"""Exception type of the converters."""

from __future__ import annotations

__all__ = ["ConversionError"]


class ConversionError(RuntimeError):
    """The checkpoint cannot be converted; the message names the file, tensor or option and why."""

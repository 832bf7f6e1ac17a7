"""Checkpoint converters (installed as warpformer.converters)."""

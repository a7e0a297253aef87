"""Benchmark loaders (GSM8K, MATH-500, AQuA, generic JSONL)."""

from __future__ import annotations


class DataError(ValueError):
    """A data file that cannot be used as given; the message names file and line."""

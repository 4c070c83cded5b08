"""Padded sizes for compiled programs: one program per bucket, not one per length.

Engine batches, prompt rows and train batches are padded up to a bucket so that XLA
compiles a handful of shapes over a whole run instead of one per length seen.
"""

from __future__ import annotations


def next_bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum)."""
    size = max(n, minimum, 1)
    return 1 << (size - 1).bit_length()

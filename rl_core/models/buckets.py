"""Padded sizes for compiled programs: one program per bucket, not one per length.

Engine batches, prompt rows and train batches are padded up to a bucket so that XLA
compiles a handful of shapes over a whole run instead of one per length seen.
"""

from __future__ import annotations


def next_bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum)."""
    size = max(n, minimum, 1)
    return 1 << (size - 1).bit_length()


def quarter_bucket(n: int, minimum: int) -> int:
    """The smallest multiple of a quarter of n's power-of-two octave >= max(n, minimum):
    ..., 64, 80, 96, 112, 128, 160, ... At most 25 % padding for four programs per octave
    where `next_bucket` pads up to 100 % with one."""
    size = max(n, minimum, 1)
    if size <= 4:
        return size
    step = (1 << ((size - 1).bit_length() - 1)) // 4
    return -(-size // step) * step

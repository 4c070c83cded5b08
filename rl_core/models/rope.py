"""Rotary position embedding (Su et al., 2021) and the scaling variants of Llama / Qwen configs.

The frequencies are fixed by the config, so they are computed once on the host (numpy, in
float32 as transformers does) and enter the traced program as constants. Only ``dynamic``
NTK scaling depends on the input (the longest position seen), and is computed in-graph.

Variants (equations as in transformers' ``modeling_rope_utils``):

- default: ``inv_freq_i = theta^(-2i/d)``.
- ``linear`` (position interpolation, Chen et al. 2023): ``inv_freq / factor``.
- ``dynamic`` (NTK-aware): for a sequence of length ``L > max_seq_len``,
  ``theta' = theta * (factor * L / max_seq_len - (factor - 1)) ** (d / (d - 2))``;
  identical to the default up to ``max_seq_len``.
- ``yarn`` (Peng et al. 2023): interpolated and extrapolated frequencies blended by a linear
  ramp between the ``beta_fast`` / ``beta_slow`` correction dimensions; cos and sin are scaled
  by ``attention_factor`` (default ``0.1 ln(factor) + 1``).
- ``llama3`` (Llama 3.1): wavelengths above ``original / low_freq_factor`` are divided by
  ``factor``, those below ``original / high_freq_factor`` kept, and the band in between
  smoothly interpolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from rl_core.models.config import RopeScaling


def _default_inv_freq(theta: float, dim: int) -> np.ndarray:  # [dim/2]
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def _yarn(theta: float, dim: int, s: RopeScaling, max_seq_len: int) -> tuple[np.ndarray, float]:
    factor = s.factor
    original = s.original_max_position_embeddings or max_seq_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.attention_factor is not None:
        attention = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention = mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)
    else:
        attention = mscale(factor)
    beta_fast, beta_slow = s.beta_fast or 32.0, s.beta_slow or 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = np.float32(theta) ** (np.arange(0, dim, 2).astype(np.float32) / dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    inv = interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight
    return inv.astype(np.float32), float(attention)


def _llama3(theta: float, dim: int, s: RopeScaling) -> np.ndarray:
    inv = _default_inv_freq(theta, dim)
    assert s.low_freq_factor is not None and s.high_freq_factor is not None
    assert s.original_max_position_embeddings is not None  # required by the config parser
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


@dataclass(frozen=True)
class Rope:
    """The rotation of one model: frequencies plus the cos/sin scale (YaRN), ready to apply."""

    inv_freq: tuple[float, ...]  # [Dh/2]; a tuple so the object is hashable and static
    attention_scale: float = 1.0
    dynamic_factor: float | None = None  # dynamic NTK: recompute past max_seq_len
    theta: float = 10_000.0
    max_seq_len: int = 2048

    @classmethod
    def build(
        cls, *, theta: float, head_dim: int, scaling: RopeScaling | None, max_seq_len: int
    ) -> Rope:
        inv, scale, dynamic = _default_inv_freq(theta, head_dim), 1.0, None
        if scaling is not None:
            if scaling.kind == "linear":
                inv = (inv / np.float32(scaling.factor)).astype(np.float32)
            elif scaling.kind == "llama3":
                inv = _llama3(theta, head_dim, scaling)
            elif scaling.kind == "yarn":
                inv, scale = _yarn(theta, head_dim, scaling, max_seq_len)
            elif scaling.kind == "dynamic":
                dynamic = scaling.factor
        return cls(tuple(float(x) for x in inv), scale, dynamic, theta, max_seq_len)

    def _frequencies(self, positions: jax.Array) -> jax.Array:  # [B, T] -> [Dh/2]
        inv = jnp.asarray(np.asarray(self.inv_freq, np.float32))
        if self.dynamic_factor is None:
            return inv
        dim = 2 * inv.shape[0]
        f, m = self.dynamic_factor, self.max_seq_len
        length = jnp.maximum(jnp.max(positions) + 1, m).astype(jnp.float32)
        base = self.theta * (f * length / m - (f - 1)) ** (dim / (dim - 2))
        exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
        return 1.0 / (base**exponents)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Rotate ``x`` [B, T, H, Dh] at ``positions`` [B, T], "rotate half" layout as in Llama.

        Pairs (x_i, x_{i+Dh/2}) are rotated by ``positions * inv_freq_i``.
        """
        half = x.shape[-1] // 2
        angles = positions.astype(jnp.float32)[..., None] * self._frequencies(positions)
        cos = (jnp.cos(angles) * self.attention_scale)[:, :, None, :]  # [B, T, 1, Dh/2]
        sin = (jnp.sin(angles) * self.attention_scale)[:, :, None, :]
        x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
        rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return rotated.astype(x.dtype)

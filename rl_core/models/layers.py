"""Building blocks of the decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.config import ModelConfig

# A finite "minus infinity": a query whose keys are all masked (a left-pad
# slot) gets a uniform softmax instead of NaNs that would leak into gradients.
_MASKED = -1e30


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32 (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs) -> None:
        del rngs  # deterministic init; the argument keeps every module's signature alike
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., D]
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.scale[...]).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (Su et al., 2021), "rotate half" layout as in Llama.

    x: [B, T, H, Dh]; positions: [B, T] int. Pairs (x_i, x_{i+Dh/2}) are rotated
    by positions * theta^(-2i/Dh).
    """
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [Dh/2]
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, T, Dh/2]
    cos = jnp.cos(angles)[:, :, None, :]  # [B, T, 1, Dh/2]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        c = config
        dtype = jnp.dtype(c.dtype)

        def linear(din: int, dout: int) -> nnx.Linear:
            return nnx.Linear(din, dout, use_bias=False, dtype=dtype, rngs=rngs)

        self.q = linear(c.d_model, c.n_heads * c.head_dim)
        self.k = linear(c.d_model, c.n_kv_heads * c.head_dim)
        self.v = linear(c.d_model, c.n_kv_heads * c.head_dim)
        self.o = linear(c.n_heads * c.head_dim, c.d_model)
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.rope_theta = c.rope_theta

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # [B, T]
        mask: jax.Array,  # [B, T, S] bool: query t may attend key slot s
        kv: tuple[jax.Array, jax.Array] | None = None,  # cache [B, S, Hkv, Dh] x2
        index: jax.Array | None = None,  # [] slot where this call's keys are written
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:  # [B, T, D], updated cache
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        q = apply_rope(q, positions, self.rope_theta)
        k = apply_rope(k, positions, self.rope_theta)
        if kv is not None:
            assert index is not None
            start = (0, index, 0, 0)
            k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), start)
            v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), start)
            kv = (k, v)
        groups = self.n_heads // self.n_kv_heads
        q = q.reshape(b, t, self.n_kv_heads, groups, self.head_dim)  # [B, T, Hkv, G, Dh]
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32)
        scores = scores / jnp.sqrt(jnp.float32(self.head_dim))
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)  # [B, Hkv, G, T, S]
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", weights, v).reshape(b, t, -1)
        return self.o(out), kv


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer, 2020)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        dtype = jnp.dtype(config.dtype)
        d, f = config.d_model, config.d_ff
        self.gate = nnx.Linear(d, f, use_bias=False, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(d, f, use_bias=False, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(f, d, use_bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, D]
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        self.attn_norm = RMSNorm(config.d_model, eps=config.norm_eps, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps, rngs=rngs)
        self.mlp = SwiGLU(config, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # [B, T]
        mask: jax.Array,  # [B, T, S]
        kv: tuple[jax.Array, jax.Array] | None = None,
        index: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        h, kv = self.attn(self.attn_norm(x), positions, mask, kv, index)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv

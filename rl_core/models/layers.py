"""Building blocks of the decoder: RMSNorm, grouped-query attention, SwiGLU, the block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.config import ModelConfig
from rl_core.models.rope import Rope

# A finite "minus infinity": a query whose keys are all masked (a padding slot)
# gets a uniform softmax instead of NaNs that would leak into gradients.
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


def rope_of(config: ModelConfig) -> Rope:
    return Rope.build(
        theta=config.rope_theta,
        head_dim=config.head_dim,
        scaling=config.rope_scaling,
        max_seq_len=config.max_seq_len,
    )


def write_rows(
    cache: jax.Array,  # [B, Hkv, S, Dh]
    new: jax.Array,  # [B, Hkv, T, Dh]
    start: jax.Array,  # [B] int32: the slot of each row's first new token
) -> jax.Array:  # [B, Hkv, S, Dh]
    """Write each row's new keys (or values) at its own offset: rows are at different lengths."""

    def one(c: jax.Array, n: jax.Array, i: jax.Array) -> jax.Array:
        return jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (0, i, 0))

    return jax.vmap(one)(cache, new, start)


class Attention(nnx.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads.

    Optional q/k/v biases (Qwen2) and per-head RMSNorm of queries and keys before RoPE
    (Qwen3); scores are scaled by 1/sqrt(head_dim) and computed in float32.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        c = config
        dtype = jnp.dtype(c.dtype)

        def linear(din: int, dout: int, bias: bool) -> nnx.Linear:
            return nnx.Linear(din, dout, use_bias=bias, dtype=dtype, rngs=rngs)

        self.q = linear(c.d_model, c.n_heads * c.head_dim, c.qkv_bias)
        self.k = linear(c.d_model, c.n_kv_heads * c.head_dim, c.qkv_bias)
        self.v = linear(c.d_model, c.n_kv_heads * c.head_dim, c.qkv_bias)
        self.o = linear(c.n_heads * c.head_dim, c.d_model, False)
        self.q_norm = RMSNorm(c.head_dim, eps=c.norm_eps, rngs=rngs) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, eps=c.norm_eps, rngs=rngs) if c.qk_norm else None
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.rope = rope_of(c)
        # Per-head ALiBi slopes (plain floats: static, not weights), halving head by head.
        self.alibi = (
            tuple(c.alibi_slope * 0.5**h for h in range(c.n_heads)) if c.alibi_slope else None
        )

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # [B, T]
        mask: jax.Array,  # [B, T, S] bool: query t may attend key slot s
        kv: tuple[jax.Array, jax.Array] | None = None,  # cache [B, Hkv, S, Dh] x2
        start: jax.Array | None = None,  # [B] slot where each row's new keys are written
        key_positions: jax.Array | None = None,  # [B, S]: ALiBi's distances, where slot != position
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:  # [B, T, D], updated cache
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rope(q, positions)
        k = self.rope(k, positions).transpose(0, 2, 1, 3)  # [B, Hkv, T, Dh]
        v = v.transpose(0, 2, 1, 3)
        if kv is not None:
            assert start is not None
            k, v = write_rows(kv[0], k, start), write_rows(kv[1], v, start)  # [B, Hkv, S, Dh]
            kv = (k, v)
        groups = self.n_heads // self.n_kv_heads
        q = q.reshape(b, t, self.n_kv_heads, groups, self.head_dim)  # [B, T, Hkv, G, Dh]
        scores = jnp.einsum("btkgd,bksd->bkgts", q, k).astype(jnp.float32)
        scores = scores / jnp.sqrt(jnp.float32(self.head_dim))
        if self.alibi is not None:
            # [Hkv, G] as the grouped scores are laid out: head = kv * G + g.
            slopes = jnp.asarray(self.alibi, jnp.float32).reshape(self.n_kv_heads, groups)
            if key_positions is None:
                gap = distances(start, t, k.shape[2])
            else:
                gap = position_distances(positions, key_positions)
            scores = scores - slopes[None, :, :, None, None] * gap
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)  # [B, Hkv, G, T, S]
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bksd->bkgtd", weights, v)  # heads first, as the cache
        out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, -1)  # [B, T, H * Dh]
        return self.o(out), kv


def distances(start: jax.Array | None, t: int, s: int) -> jax.Array:  # [B or 1, 1, 1, T, S]
    """Tokens from each query back to each key slot (0 for itself and for later slots,
    which the mask hides). Slots are contiguous per row and a packed row's segments only
    see themselves, so slot distance is position distance."""
    first = jnp.zeros((1,), jnp.int32) if start is None else start  # [B] or [1]
    query = first[:, None] + jnp.arange(t)[None, :]  # [B, T]
    gap = query[:, :, None] - jnp.arange(s)[None, None, :]  # [B, T, S]
    return jnp.maximum(gap, 0).astype(jnp.float32)[:, None, None]


def position_distances(
    positions: jax.Array,  # [B, T]: each query's position
    key_positions: jax.Array,  # [B, S]: each key slot's
) -> jax.Array:  # [B, 1, 1, T, S]
    """Tokens from each query back to each key, by position: for a row whose slots are not
    its positions (the engine's packed extend holds several prefixes end to end)."""
    gap = positions[:, :, None] - key_positions[:, None, :]
    return jnp.maximum(gap, 0).astype(jnp.float32)[:, None, None]


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
        start: jax.Array | None = None,  # [B]
        key_positions: jax.Array | None = None,  # [B, S]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        h, kv = self.attn(self.attn_norm(x), positions, mask, kv, start, key_positions)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv

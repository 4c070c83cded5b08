"""The built-in rollout engine: jitted prefill + decode of an NNX model with a KV cache.

Shapes are bucketed so a run compiles a handful of programs, not one per
request: the batch is padded to a fixed row count, prompts are left-padded to
the next power of two, and the number of new tokens to the next power of two.
Sampling parameters, seeds and per-row token limits are traced arrays, so
they never recompile either. All device work runs in one dedicated thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.rollout.batcher import MicroBatcher, Request
from rl_core.rollout.sampling import sample


def next_bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum)."""
    size = max(n, minimum, 1)
    return 1 << (size - 1).bit_length()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    stop_ids: tuple[int, ...]
    pad_id: int = 0
    # Fixed row counts: a batch is padded up to the smallest that fits. Two
    # sizes trade a little wasted compute for few compiles as episodes finish.
    batch_buckets: tuple[int, ...] = (8, 64)
    min_prompt_bucket: int = 32
    min_new_tokens_bucket: int = 8
    batch_window_s: float = 0.002


class JaxEngine:
    """`RolloutEngine` over an NNX `Model`, with its own device thread unless given one."""

    def __init__(
        self,
        model: Model,
        *,
        config: EngineConfig,
        executor: Executor | None = None,
        policy_version: int = 0,
    ) -> None:
        self._graphdef, state = nnx.split(model)
        self.config = config
        self._policy: tuple[Any, int] = (state, policy_version)  # swapped as one tuple
        self._own_executor = executor is None
        self.executor: Executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rl-device"
        )
        self._stop = np.asarray(config.stop_ids, np.int32)
        self._batcher: MicroBatcher | None = None

    @property
    def policy_version(self) -> int:
        return self._policy[1]

    def update_weights(self, params: Any, version: int) -> None:
        # Batches read self._policy once when they start, so a swap between
        # (or during) batches is safe without a lock.
        self._policy = (params, version)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[JaxEngine]:
        """Batch `generate` calls from concurrent tasks while the block runs."""
        batcher = MicroBatcher(
            self._run_requests,
            self.executor,
            max_rows=max(self.config.batch_buckets),
            window_s=self.config.batch_window_s,
        )
        task = asyncio.create_task(batcher.serve(), name="rl-engine-batcher")
        self._batcher = batcher
        try:
            yield self
        finally:
            self._batcher = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            batcher.cancel_queued()

    @property
    def batches_run(self) -> int:
        return self._batcher.batches_run if self._batcher else 0

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
    ) -> list[Completion]:
        requests = _requests(prompts, max_new_tokens, sampling, seeds)
        if self._batcher is not None:
            return await self._batcher.submit(requests)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._run_requests, requests)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
    ) -> list[Completion]:
        """Synchronous `generate`, on the calling thread (tests, scripts)."""
        return self._run_requests(_requests(prompts, max_new_tokens, sampling, seeds))

    def close(self) -> None:
        if self._own_executor:
            self.executor.shutdown(wait=True)

    def _run_requests(self, requests: list[Request]) -> list[Completion]:
        rows = max(self.config.batch_buckets)
        out: list[Completion] = []
        for start in range(0, len(requests), rows):
            out.extend(self._run_chunk(requests[start : start + rows]))
        return out

    def _run_chunk(self, requests: list[Request]) -> list[Completion]:
        state, version = self._policy
        n = len(requests)
        rows = min(b for b in self.config.batch_buckets if b >= n)
        longest = max(len(r.prompt) for r in requests)
        p = next_bucket(longest, self.config.min_prompt_bucket)
        max_new = next_bucket(
            max(r.max_new_tokens for r in requests), self.config.min_new_tokens_bucket
        )
        tokens = np.full((rows, p), self.config.pad_id, np.int32)
        valid = np.zeros((rows, p), bool)
        limits = np.zeros((rows,), np.int32)  # padding rows: 0 tokens, done at once
        temperature = np.ones((rows,), np.float32)
        top_k = np.zeros((rows,), np.int32)
        top_p = np.ones((rows,), np.float32)
        seeds = np.zeros((rows,), np.uint32)
        valid[:, -1] = True  # padding rows see one token so no softmax is over nothing
        for i, r in enumerate(requests):
            if not r.prompt:
                raise RolloutError("cannot continue an empty prompt")
            length = len(r.prompt)
            tokens[i, p - length :] = r.prompt  # left-pad: last prompt token in the last slot
            valid[i, :] = False
            valid[i, p - length :] = True
            limits[i] = r.max_new_tokens
            temperature[i] = r.sampling.temperature
            top_k[i] = r.sampling.top_k
            top_p[i] = r.sampling.top_p
            seeds[i] = r.seed % (1 << 32)
        out_tokens, out_logprobs, lengths = jax.device_get(
            _generate(
                self._graphdef,
                state,
                tokens,
                valid,
                limits,
                temperature,
                top_k,
                top_p,
                seeds,
                self._stop,
                max_new=max_new,
            )
        )
        stop = set(self.config.stop_ids)
        completions = []
        for i in range(n):
            k = int(lengths[i])
            ids = [int(t) for t in out_tokens[i, :k]]
            completions.append(
                Completion(
                    tokens=ids,
                    logprobs=[float(x) for x in out_logprobs[i, :k]],
                    finish_reason="stop" if ids and ids[-1] in stop else "length",
                    policy_version=version,
                )
            )
        return completions


def _requests(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    sampling: SamplingParams,
    seeds: Sequence[int],
) -> list[Request]:
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else max_new_tokens
    if not len(prompts) == len(limits) == len(seeds):
        raise RolloutError("prompts, max_new_tokens and seeds must have the same length")
    if any(m < 1 for m in limits):
        raise RolloutError("max_new_tokens must be at least 1")
    return [
        Request(prompt=list(p), max_new_tokens=int(m), sampling=sampling, seed=int(s))
        for p, m, s in zip(prompts, limits, seeds, strict=True)
    ]


# One compiled program per (model structure, shapes): engines of the same model
# config share it, so a second run in the same process compiles nothing.
@functools.partial(jax.jit, static_argnames=("graphdef", "max_new"))
def _generate(
    graphdef: Any,
    state: Any,
    tokens: jax.Array,  # [B, P] int32, left-padded
    valid: jax.Array,  # [B, P] bool
    limits: jax.Array,  # [B] int32: new tokens allowed per row
    temperature: jax.Array,  # [B]
    top_k: jax.Array,  # [B]
    top_p: jax.Array,  # [B]
    seeds: jax.Array,  # [B] uint32
    stop_ids: jax.Array,  # [S] int32
    *,
    max_new: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # tokens [B, N], logprobs [B, N], lengths [B]
    model = nnx.merge(graphdef, state)
    b, p = tokens.shape
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)  # true positions, pads at 0
    cache = model.init_cache(b, p + max_new)
    logits, cache = model(tokens, positions, valid=valid, cache=cache)  # prefill
    assert cache is not None
    keys = jax.vmap(jax.random.key)(seeds)

    def cond(carry: tuple[Any, ...]) -> jax.Array:
        i, _, _, _, done, _, _, _ = carry
        return jnp.logical_and(i < max_new, ~jnp.all(done))

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        i, cache, last, pos, done, out_t, out_lp, lengths = carry
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
        tok, lp = sample(last, step_keys, temperature, top_k, top_p)
        live = ~done
        tok = jnp.where(live, tok, 0)
        out_t = out_t.at[:, i].set(tok)
        out_lp = out_lp.at[:, i].set(jnp.where(live, lp, 0.0))
        lengths = lengths + live
        done = done | jnp.isin(tok, stop_ids) | (lengths >= limits)
        logits, cache = model(tok[:, None], pos[:, None], valid=live[:, None], cache=cache)
        return i + 1, cache, logits[:, 0], pos + 1, done, out_t, out_lp, lengths

    carry = (
        jnp.zeros((), jnp.int32),
        cache,
        logits[:, -1],
        positions[:, -1] + 1,
        limits <= 0,
        jnp.zeros((b, max_new), jnp.int32),
        jnp.zeros((b, max_new), jnp.float32),
        jnp.zeros((b,), jnp.int32),
    )
    _, _, _, _, _, out_t, out_lp, lengths = jax.lax.while_loop(cond, body, carry)
    return out_t, out_lp, lengths

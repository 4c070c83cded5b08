"""Continuous batching on the host: slots of a fixed-shape batch, filled and emptied per step.

A `Scheduler` owns one KV cache of ``rows x length`` slots and the requests in them. Each
`step` first admits waiting requests into free slots (one packed prefill), then decodes
one token for every running slot; a request that hits a stop token or its token limit
leaves at once, and its slot is free for the next step. The cache's shape moves between a
few buckets (rows from ``EngineConfig.batch_buckets``, length a power of two) as the load
changes, so the programs compiled stay few.

Decoding runs one step ahead of the host: step n+1 is dispatched with step n's tokens
still on the device, and only then are step n's tokens read and recorded, so the host's
bookkeeping overlaps the device's next step instead of leaving it idle. A row that stopped
at step n gets one token too many at n+1, which is dropped; a step that admits or resizes
reads everything first, as it needs to know which slots are free. So does a step with a
row under a grammar: its next token mask depends on the token just sampled, which the host
must read and feed to the row's matcher (`rl_core.rollout.grammar`) before dispatching.
Batches without grammars keep the pipelining (``SchedulerStats.pipelined_steps``).

A request that finishes leaves its keys and values behind in a row of the prefix pool
(`rl_core.rollout.prefix_pool`): a joining prompt that continues a parked sequence (an
agent's next turn) is admitted by `_extend`, which prefills only its new tokens, instead
of the packed prefill of the whole prompt.

With adapter slots, each request names its adapter (`Request.adapter`): every device call
gets each row's slot (each token's, in the packed prefill), so requests of different
adapters share the batch. A parked sequence belongs to its adapter's weights as much as
to the base's: the prefix index keys it by the adapter's slot and that slot's version
(`Request.adapter_version`), and forgets a slot's entries once it holds another adapter.

Not thread-safe: one thread (the engine's device thread) drives a scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_core.models.buckets import next_bucket
from rl_core.models.config import ModelConfig
from rl_core.models.kv_cache import KVCache
from rl_core.rollout import steps
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.rollout.grammar import Constraint, words
from rl_core.rollout.prefix_pool import Hit, PrefixIndex
from rl_core.rollout.sampling import Controls, Sampled

# Steps in a row a cache must be bigger than its running rows need before it shrinks. A
# resize copies the whole cache and may need a program for a new pair of shapes, and a
# multi-turn run's load swings across a row bucket every few steps: an agent's next turn
# comes back a host round trip after its last one ended. Shrinking at once resized back
# and forth; growing cannot wait.
SHRINK_AFTER = 32


# A packed extend's row holds every hit's prefix, and each new token scores all of them
# (those of other prompts are masked): a query costs about as much as ~3k keys of
# attention on SmolLM2, so a call holds at most this many packing budgets of keys, and
# hits beyond it go to the next call.
EXTEND_KEYS = 8


# An extend runs in an already compiled shape that holds it while that costs at most this
# many times its own shape (`_extend_cost`): a SmolLM2 extend compiles in ~3 s and runs
# in ~0.2 s, so compiling a shape pays only if it is met often.
REUSE_COST = 2.0


def packed_bucket(n: int, minimum: int) -> int:
    """The smallest of 2^k, 1.25, 1.5 and 1.75 * 2^k that is >= max(n, minimum).

    A packed prefill's row length: the prefill is compute-bound, so its padding costs what
    real tokens cost. Four sizes per doubling pad at most a fifth (260 tokens -> 320, where
    powers of two would give 512), for a number of compiled programs that still grows
    with the logarithm of the longest row.
    """
    size = next_bucket(n, minimum)
    if size < 8:
        return size
    step = size // 8
    return next(b for b in range(size // 2 + step, size + 1, step) if b >= max(n, minimum))


@dataclasses.dataclass
class Request:
    """One prompt to continue; ``future`` is set when an asyncio caller waits on it."""

    prompt: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    future: asyncio.Future[Completion] | None = None
    constraint: Constraint | None = None  # the compiled grammar its tokens must follow
    top_logprobs: int = 0  # alternatives to report per token (<= sampling.TOP_LOGPROBS)
    adapter: int | None = None  # the engine's adapter slot; None: the base alone
    adapter_version: int = 0  # that slot's version when the request was made

    @property
    def prefix_tag(self) -> tuple[int, int] | None:
        """Whose keys and values its prefix is: None for the base's."""
        return None if self.adapter is None else (self.adapter, self.adapter_version)


@dataclasses.dataclass
class _Running:
    request: Request
    version: int  # the policy that sampled its first token
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _InFlight:
    """A decode step dispatched but not read yet: its tokens are still on the device."""

    sampled: Sampled  # [R] rows
    rows: dict[int, _Running]  # slot -> the request it decoded for


@dataclasses.dataclass
class SchedulerStats:
    prefill_calls: int = 0  # packed prefills of whole prompts
    extend_calls: int = 0  # prefills of what follows a parked prefix
    decode_steps: int = 0
    decoded_rows: int = 0  # the cache's rows, summed over decode steps (empty ones too)
    admitted: int = 0
    resizes: int = 0
    prefilled_tokens: int = 0  # prompt tokens computed (padding not counted)
    reused_tokens: int = 0  # prompt tokens whose keys and values came from the prefix pool
    prefix_hits: int = 0  # prompts that continued a parked sequence
    pipelined_steps: int = 0  # decode steps dispatched before the previous one was read
    constrained_steps: int = 0  # decode steps with a row under a grammar (never pipelined)


class Scheduler:
    def __init__(
        self,
        programs: steps.Programs,
        model_config: ModelConfig,
        *,
        policy: Callable[[], tuple[steps.Weights, int]],  # (flat weights, version)
        stop_ids: tuple[int, ...],
        pad_id: int,
        row_buckets: tuple[int, ...],
        min_prompt_bucket: int,
        max_packed_tokens: int,
        min_cache_bucket: int,
        max_cache_len: int,
        prefix_rows: int = 0,
        shrink_after: int = SHRINK_AFTER,
        stats: SchedulerStats | None = None,
        adapter_slots: int = 0,  # S; 0: the engine has none (its programs take no slots)
        adapter_versions: Callable[[], tuple[int, ...]] | None = None,  # each slot's version
    ) -> None:
        self._programs, self._model_config, self._policy = programs, model_config, policy
        self._stop = frozenset(stop_ids)
        self._pad_id = pad_id
        self._row_buckets = tuple(sorted(row_buckets))
        self._min_prompt, self._min_cache = min_prompt_bucket, min_cache_bucket
        self._max_packed = max_packed_tokens
        self.max_cache_len = max_cache_len
        self.waiting: deque[Request] = deque()
        self.slots: list[_Running | None] = []
        self.cache: KVCache | None = None
        self.seen: jax.Array | None = None  # [rows, V] int32: each slot's sampled tokens, counted
        self._vocab = model_config.vocab_size
        self._no_mask: dict[int, jax.Array] = {}  # rows -> an all-zero bitmask on the device
        self._inflight: _InFlight | None = None
        self.stats = stats if stats is not None else SchedulerStats()
        # Finished sequences kept for the prompts that continue them (`prefix_pool`).
        self.prefixes = PrefixIndex(prefix_rows)
        self._pool: KVCache | None = None  # [prefix_rows, >= every cache length seen]
        self._extend_shapes: set[tuple[int, int, int]] = set()  # compiled (K, N, L)
        self._version_seen = -1  # the newest policy version a device call used
        self._shrink_after = shrink_after
        self._too_big_for = 0  # steps in a row the cache was bigger than its rows need
        self._adapters = adapter_slots > 0
        self._base_slot = adapter_slots  # the all-zero slot: the base alone, and padding
        self._adapter_versions = adapter_versions
        self._versions_seen: tuple[int, ...] = ()

    @property
    def max_rows(self) -> int:
        return self._row_buckets[-1]

    @property
    def busy(self) -> bool:
        return (
            bool(self.waiting)
            or self._inflight is not None
            or any(s is not None for s in self.slots)
        )

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def step(self) -> list[tuple[Request, Completion]]:
        """Admit what fits, then decode one token for every running slot; return what finished.

        What finishes is reported one step late (see the module's docstring), never lost:
        the scheduler stays `busy` until the last step in flight is read.
        """
        self._drop_abandoned()
        finished: list[tuple[Request, Completion]] = []
        constrained = any(s is not None and s.request.constraint for s in self.slots)
        if self._count_too_big() or self.waiting or constrained:
            finished += self._settle()
            finished += self._admit()
        previous = self._inflight
        self._inflight = self._decode(previous)
        return finished + self._read(previous)

    def fail_all(self) -> list[Request]:
        """Empty the scheduler (after a device error); return every request it held."""
        held = [s.request for s in self.slots if s is not None] + list(self.waiting)
        self.waiting.clear()
        self.slots, self.cache, self._inflight, self.seen = [], None, None, None
        self.prefixes.clear()
        self._pool = None
        return held

    # admission -----------------------------------------------------------------------

    def _joining(self) -> list[Request]:
        running = sum(s is not None for s in self.slots)
        return list(itertools.islice(self.waiting, max(self.max_rows - running, 0)))

    def _shape(self, joining: list[Request]) -> tuple[int, int]:
        """The cache's (rows, length) for the running requests and ``joining``."""
        running = [s.request for s in self.slots if s is not None]
        need_len = max(_need(r) for r in [*running, *joining]) if running or joining else 0
        rows = next(b for b in self._row_buckets if b >= max(len(running) + len(joining), 1))
        length = min(next_bucket(need_len, self._min_cache), self.max_cache_len)
        return rows, max(length, need_len)

    def _current_shape(self) -> tuple[int, int] | None:
        return None if self.cache is None else (self.cache.rows, self.cache.length)

    def _admit(self) -> list[tuple[Request, Completion]]:
        joining = self._joining()
        rows, length = self._target(joining)
        if (rows, length) != self._current_shape():
            self._resize(rows, length)
        if not joining:
            return []
        for _ in joining:
            self.waiting.popleft()
        free = iter([i for i, s in enumerate(self.slots) if s is None])
        weights, version = self._policy()
        self._forget_replaced_adapters()
        hits: list[tuple[Request, Hit]] = []
        fresh: list[Request] = []
        for r in joining:
            hit = self.prefixes.take(r.prompt, version, r.prefix_tag, max_new=self._max_packed)
            if hit is not None and self._pool is not None:
                hits.append((r, hit))
            else:
                fresh.append(r)
        done: list[tuple[Request, Completion]] = []
        # Hits first: their pool rows are free for reuse once this call is dispatched, and
        # a prefill below may park a sequence that finished at its first token.
        for group in _extend_packs(hits, self._max_packed):
            done += self._extend(group, [next(free) for _ in group], weights, version)
        for chunk in _packs(fresh, self._max_packed):
            done += self._prefill(chunk, [next(free) for _ in chunk])
        return done

    def _extend(
        self,
        hits: list[tuple[Request, Hit]],
        free: list[int],
        weights: steps.Weights,
        version: int,
    ) -> list[tuple[Request, Completion]]:
        """Prefill what follows each hit's parked prefix, then move the rows to slots.

        One row, as the prefill's: the prefixes end to end (read from the pool), then the
        new tokens end to end. Padded [prompts, new tokens] instead (as it was), a run's
        extends computed 4.4 positions a real token, one or a few prompts a call each padded
        to the longest (bench/README.md, "M5"), and every cache shape was a program.
        """
        assert self.cache is not None and self._pool is not None
        news = [len(r.prompt) - h.start for r, h in hits]
        held = sum(h.start for _, h in hits)
        k, n, length = self._extend_shape(len(hits), sum(news), held)
        source_rows = np.zeros((length,), np.int32)
        source_positions = np.zeros((length,), np.int32)
        key_segments = np.full((1, length), -2, np.int32)  # -2: no query's
        key_positions = np.zeros((1, length), np.int32)
        token_slots = np.full((length,), self.cache.rows, np.int32)  # out of range: dropped
        slot_positions = np.zeros((length,), np.int32)
        tokens = np.full((1, n), self._pad_id, np.int32)
        positions = np.zeros((1, n), np.int32)
        segments = np.full((1, n), -1, np.int32)  # padding is a segment of its own
        key_segments[0, held : held + n] = -1
        last = np.zeros((k,), np.int32)
        slots = np.full((k,), self.cache.rows, np.int32)
        lengths = np.zeros((k,), np.int32)
        at, new_at = 0, 0
        for j, ((r, h), m) in enumerate(zip(hits, news, strict=True)):
            # The prefix's slots, then the new tokens' (queries at new_at, keys past held).
            prefix, end = slice(at, at + h.start), new_at + m
            source_rows[prefix], source_positions[prefix] = h.row, np.arange(h.start)
            tokens[0, new_at:end] = r.prompt[h.start :]
            positions[0, new_at:end] = np.arange(h.start, len(r.prompt))
            segments[0, new_at:end] = j
            keys = slice(held + new_at, held + end)
            for part, where in ((prefix, np.arange(h.start)), (keys, positions[0, new_at:end])):
                key_segments[0, part], key_positions[0, part] = j, where
                token_slots[part], slot_positions[part] = free[j], where
            last[j], slots[j], lengths[j] = end - 1, free[j], len(r.prompt)
            at, new_at = at + h.start, end
            self.stats.prefilled_tokens += m
            self.stats.reused_tokens += h.start
            self.stats.prefix_hits += 1
        requests = [r for r, _ in hits]
        controls, seeds = self._controls(requests, k)
        weights = self._with_token_rows(weights, requests, segments)
        prefixes = steps.gather_prefixes(
            self._pool, source_rows, source_positions, np.asarray([held], np.int32)
        )
        packed, sampled = self._programs.extend(
            weights,
            prefixes,
            key_segments,
            key_positions,
            tokens,
            positions,
            segments,
            last,
            controls,
            seeds,
        )
        self.cache = steps.insert_packed(
            self.cache, packed, token_slots, slot_positions, slots, lengths
        )
        self._version_seen = max(self._version_seen, version)
        self.stats.extend_calls += 1
        self.stats.admitted += len(hits)
        return self._seat(requests, free, slots, sampled, version)

    def _extend_shape(self, hits: int, new: int, held: int) -> tuple[int, int, int]:
        """(rows of the head, new tokens, keys) to run an extend in: a compiled shape that
        holds it if one costs at most `REUSE_COST` times its own, else its own.

        A run's extends come one or a few prompts at a time with every length of prefix
        and answer: with a program per bucketed shape, SmolLM2's guess-format run compiled
        40 of them in 3 steps (129 s) for 12.5 s of extends (bench/README.md, "M5")."""
        k = _power_of_4(hits)  # the head's rows only: few programs, little padding
        n = packed_bucket(new, self._min_prompt)
        own = (k, n, next_bucket(held + n, 1))  # keys: attention only, so coarse buckets
        cost = functools.partial(_extend_cost, self._model_config)
        holds = [
            shape
            for shape in self._extend_shapes
            if shape[0] >= k and shape[1] >= n and shape[2] >= held + shape[1]
        ]
        best = min(holds, key=lambda shape: cost(*shape), default=None)
        if best is not None and cost(*best) <= REUSE_COST * cost(*own):
            return best
        self._extend_shapes.add(own)
        return own

    def _prefill(self, joining: list[Request], free: list[int]) -> list[tuple[Request, Completion]]:
        """Prefill the joining prompts packed end to end in one row, then move them to slots.

        Padding each prompt to a common length made the prefill, which is compute-bound,
        pay for the padding too (16 chat prompts of 14-18 tokens: 512 tokens computed for
        260 real ones); packed, the row is padded once, to a bucket of the total.
        """
        assert self.cache is not None
        weights, version = self._policy()
        self._version_seen = max(self._version_seen, version)
        k = next_bucket(len(joining), 1)
        n = packed_bucket(sum(len(r.prompt) for r in joining), self._min_prompt)
        tokens = np.full((1, n), self._pad_id, np.int32)
        positions = np.zeros((1, n), np.int32)
        segments = np.full((1, n), -1, np.int32)  # padding is a segment of its own
        token_slots = np.full((n,), self.cache.rows, np.int32)  # out of range: dropped
        last = np.zeros((k,), np.int32)
        slots = np.full((k,), self.cache.rows, np.int32)
        lengths = np.zeros((k,), np.int32)
        at = 0
        for j, r in enumerate(joining):
            end = at + len(r.prompt)
            tokens[0, at:end] = r.prompt
            positions[0, at:end] = np.arange(len(r.prompt))
            segments[0, at:end] = j
            token_slots[at:end] = free[j]
            last[j], slots[j], lengths[j] = end - 1, free[j], len(r.prompt)
            at = end
        controls, seeds = self._controls(joining, k)
        weights = self._with_token_rows(weights, joining, segments)
        packed, sampled = self._programs.prefill(
            weights, tokens, positions, segments, last, controls, seeds
        )
        self.cache = steps.insert_packed(
            self.cache, packed, token_slots, positions[0], slots, lengths
        )
        self.stats.prefill_calls += 1
        self.stats.admitted += len(joining)
        self.stats.prefilled_tokens += sum(len(r.prompt) for r in joining)
        return self._seat(joining, free, slots, sampled, version)

    def _seat(
        self,
        requests: list[Request],
        free: list[int],
        slots: np.ndarray,  # [K] the slot of each row of ``sampled`` (out of range: padding)
        sampled: Sampled,
        version: int,
    ) -> list[tuple[Request, Completion]]:
        """Put admitted requests in their slots with their first token, on both sides."""
        assert self.seen is not None
        self.seen = steps.seat(self.seen, slots, sampled.token)
        for j, r in enumerate(requests):
            self.slots[free[j]] = _Running(r, version)
        return self._record(_rows(sampled, list(range(len(requests))), free, requests))

    # decoding ------------------------------------------------------------------------

    def _decode(self, previous: _InFlight | None) -> _InFlight | None:
        """Dispatch one decode step for every running slot that has room for a token.

        A slot that ``previous`` decoded for takes its newest token from the device; its
        count (the token's index, hence its random key) is one more than the host knows.
        """
        if self.cache is None:
            return None
        ahead = {} if previous is None else previous.rows
        rows = self.cache.rows
        last = np.zeros((rows,), np.int32)
        on_device = np.zeros((rows,), bool)
        counts = np.zeros((rows,), np.int32)
        active = np.zeros((rows,), bool)
        requests: list[Request | None] = [None] * rows
        decoding: dict[int, _Running] = {}
        for i, s in enumerate(self.slots):
            if s is None:
                continue
            pending = ahead.get(i) is s
            count = len(s.tokens) + pending
            if count >= s.request.max_new_tokens:
                continue  # its last token is the one in flight
            on_device[i], counts[i], active[i] = pending, count, True
            last[i] = 0 if pending else s.tokens[-1]
            requests[i], decoding[i] = s.request, s
        if not decoding:
            return None
        weights, version = self._policy()
        self._version_seen = max(self._version_seen, version)
        controls, seeds = self._controls(requests, rows)
        assert self.seen is not None
        adapters = [None if r is None else r.adapter for r in requests]
        self.cache, self.seen, sampled = self._programs.decode(
            self._with_rows(weights, adapters, rows),
            self.cache,
            self.seen,
            last,
            previous.sampled.token if previous is not None else np.zeros((rows,), np.int32),
            on_device,
            active,
            controls,
            seeds,
            counts,
        )
        self.stats.decode_steps += 1
        self.stats.decoded_rows += rows
        self.stats.pipelined_steps += previous is not None
        self.stats.constrained_steps += any(r is not None and r.constraint for r in requests)
        return _InFlight(sampled, decoding)

    def _read(self, inflight: _InFlight | None) -> list[tuple[Request, Completion]]:
        """Record a dispatched step's tokens, for the rows still running the same request
        (a row that stopped, or whose caller gave up, has had its slot emptied since)."""
        if inflight is None:
            return []
        live = [i for i, s in inflight.rows.items() if self.slots[i] is s]
        requests = [inflight.rows[i].request for i in live]
        return self._record(_rows(inflight.sampled, live, live, requests))

    def _settle(self) -> list[tuple[Request, Completion]]:
        inflight, self._inflight = self._inflight, None
        return self._read(inflight)

    def _record(self, sampled: list[_Row]) -> list[tuple[Request, Completion]]:
        done = []
        for slot, token, logprob, top in sampled:
            s = self.slots[slot]
            assert s is not None
            s.tokens.append(token)
            s.logprobs.append(logprob)
            if top is not None:
                s.top.append(top)
            stopped = token in self._stop
            constraint = s.request.constraint
            if constraint is not None and not stopped:
                # A finished grammar ends the completion here when no stop token can
                # (an engine without stop ids); otherwise its mask now allows only those.
                stopped = constraint.advance(token) and not self._stop
            if stopped or len(s.tokens) >= s.request.max_new_tokens:
                self._park(slot, s)
                self.slots[slot] = None
                done.append(
                    (
                        s.request,
                        Completion(
                            tokens=s.tokens,
                            logprobs=s.logprobs,
                            finish_reason="stop" if stopped else "length",
                            policy_version=s.version,
                            top_logprobs=s.top if s.request.top_logprobs else None,
                        ),
                    )
                )
        return done

    def _park(self, slot: int, s: _Running) -> None:
        """Keep a finished sequence's keys and values for the prompt that may continue it.

        The cache holds the prompt and every sampled token but the last (never fed back).
        Parked only if one policy computed all of it: none newer has run since it started
        (versions only grow)."""
        if self.prefixes.rows == 0 or self.cache is None or s.version != self._version_seen:
            return
        held = [*s.request.prompt, *s.tokens[:-1]]
        if len(held) > self.cache.length:
            return
        row = self.prefixes.park(held, s.version, s.request.prefix_tag)
        if row is None:
            return
        if self._pool is None or self._pool.length < self.cache.length:
            self._pool = self._grown_pool(self.cache.length)
        self._pool = steps.stash(self._pool, self.cache, np.int32(slot), np.int32(row))

    # adapters -----------------------------------------------------------------------

    def _slot_of(self, adapter: int | None) -> int:
        return self._base_slot if adapter is None else adapter

    def _with_rows(
        self, weights: steps.Weights, adapters: Sequence[int | None], rows: int
    ) -> steps.Weights:
        """``weights`` with each of ``rows`` rows' adapter slot (past ``adapters``: padding,
        the base's); as they are for an engine without adapters."""
        if not self._adapters:
            return weights
        slots = np.full((rows,), self._base_slot, np.int32)
        slots[: len(adapters)] = [self._slot_of(a) for a in adapters]
        return weights._replace(rows=slots)

    def _with_token_rows(
        self, weights: steps.Weights, requests: Sequence[Request], segments: np.ndarray
    ) -> steps.Weights:
        """``weights`` with each packed token's adapter slot (``segments`` [1, N]: the
        request each token belongs to); as they are for an engine without adapters."""
        if not self._adapters:
            return weights
        # A lookup by segment, whose -1 (padding) takes the last entry, the base's.
        of_segment = [self._slot_of(r.adapter) for r in requests] + [self._base_slot]
        return weights._replace(rows=np.asarray(of_segment, np.int32)[segments])

    def _forget_replaced_adapters(self) -> None:
        """Drop the parked prefixes of slots that hold another adapter since they parked:
        their tags can never match again, and their pool rows are better given back now."""
        if self._adapter_versions is None:
            return
        versions = self._adapter_versions()
        if versions != self._versions_seen:
            self._versions_seen = versions
            self.prefixes.retain(lambda tag: tag is None or versions[tag[0]] == tag[1])

    def _grown_pool(self, length: int) -> KVCache:
        fresh = KVCache.empty(self._model_config, self.prefixes.rows, length)
        if self._pool is None:
            return fresh
        every = jnp.arange(self.prefixes.rows, dtype=jnp.int32)
        grown: KVCache = steps.insert(fresh, self._pool, every)
        return grown

    def _controls(
        self, requests: Sequence[Request | None], rows: int
    ) -> tuple[Controls, np.ndarray]:  # [rows] controls, seeds [rows] uint32
        """Each row's sampling controls, with the next-token bitmask of the rows under a
        grammar (their matchers have taken every token recorded so far)."""
        temperature = np.ones((rows,), np.float32)
        top_k = np.zeros((rows,), np.int32)
        top_p = np.ones((rows,), np.float32)
        frequency = np.zeros((rows,), np.float32)
        presence = np.zeros((rows,), np.float32)
        constrained = np.zeros((rows,), bool)
        top = np.zeros((rows,), bool)
        seeds = np.zeros((rows,), np.uint32)
        bitmask: np.ndarray | None = None
        for i, r in enumerate(requests):
            if r is None:
                continue
            p = r.sampling
            temperature[i], top_k[i], top_p[i] = p.temperature, p.top_k, p.top_p
            frequency[i], presence[i] = p.frequency_penalty, p.presence_penalty
            top[i] = r.top_logprobs > 0
            seeds[i] = r.seed % (1 << 32)
            if r.constraint is not None:
                if bitmask is None:
                    bitmask = np.zeros((rows, words(self._vocab)), np.int32)
                r.constraint.mask_into(bitmask[i])
                constrained[i] = True
        allowed: Any = bitmask
        if bitmask is None:
            # Nothing is constrained: the same zeros on the device every step, no transfer.
            if rows not in self._no_mask:
                self._no_mask[rows] = jnp.zeros((rows, words(self._vocab)), jnp.int32)
            allowed = self._no_mask[rows]
        # Host arrays: the jitted call moves them to the device with its other arguments.
        fields = [temperature, top_k, top_p, frequency, presence, constrained, allowed, top]
        return Controls._make(fields), seeds

    def _drop_abandoned(self) -> None:
        # A caller that timed out no longer waits: free its slot instead of decoding on.
        for i, s in enumerate(self.slots):
            if s is not None and s.request.future is not None and s.request.future.done():
                self.slots[i] = None

    # shapes --------------------------------------------------------------------------

    def _target(self, joining: list[Request]) -> tuple[int, int]:
        """The shape to run the next step in: the current one unless it is too small, or
        too big for ``shrink_after`` steps in a row (`SHRINK_AFTER`)."""
        want, current = self._shape(joining), self._current_shape()
        if current is None or self._too_big_for >= self._shrink_after:
            return want
        return max(want[0], current[0]), max(want[1], current[1])

    def _count_too_big(self) -> bool:
        """Count the steps the cache has been bigger than the running rows need; True
        once it is time to shrink it."""
        want, current = self._shape([]), self._current_shape()
        smaller = current is not None and want != current
        self._too_big_for = self._too_big_for + 1 if smaller else 0
        return smaller and self._too_big_for >= self._shrink_after

    def _resize(self, rows: int, length: int) -> None:
        """Move the running slots into a cache of ``rows x length`` (compacted to the front)."""
        old = [i for i, s in enumerate(self.slots) if s is not None]
        assert len(old) <= rows
        if self.cache is not None and self.seen is not None and old:
            source = np.full((rows,), self.cache.rows, np.int32)
            source[: len(old)] = old
            self.cache, self.seen = steps.resize(self.cache, self.seen, source, length)
        else:
            self.cache = KVCache.empty(self._model_config, rows, length)
            self.seen = jnp.zeros((rows, self._vocab), jnp.int32)
        self.slots = [self.slots[i] for i in old] + [None] * (rows - len(old))
        self._too_big_for = 0
        self.stats.resizes += 1


def _packs(requests: list[Request], budget: int) -> list[list[Request]]:
    """Consecutive runs of requests whose prompts add up to at most ``budget`` tokens
    (a longer prompt goes alone)."""
    packs: list[list[Request]] = [[]]
    used = 0
    for r in requests:
        if packs[-1] and used + len(r.prompt) > budget:
            packs.append([])
            used = 0
        packs[-1].append(r)
        used += len(r.prompt)
    return packs


def _extend_packs(hits: list[tuple[Request, Hit]], budget: int) -> list[list[tuple[Request, Hit]]]:
    """Consecutive runs of hits whose new tokens add up to at most ``budget`` and whose
    prefixes and new tokens to at most `EXTEND_KEYS` budgets (a longer one goes alone)."""
    packs: list[list[tuple[Request, Hit]]] = []
    new = keys = 0
    for r, h in hits:
        m = len(r.prompt) - h.start
        if not packs or new + m > budget or keys + len(r.prompt) > EXTEND_KEYS * budget:
            packs.append([])
            new = keys = 0
        packs[-1].append((r, h))
        new, keys = new + m, keys + len(r.prompt)
    return packs


def _extend_cost(config: ModelConfig, rows: int, new: int, keys: int) -> float:
    """FLOPs of an extend of ``new`` positions over ``keys`` key slots with ``rows`` head
    rows: the blocks' matmuls, attention's scores and sums, the output head."""
    c = config
    scores = c.n_layers * 4 * c.n_heads * c.head_dim * keys  # q.k and p.v, per new token
    return new * (c.block_flops_per_token + scores) + rows * 2 * c.vocab_size * c.d_model


def _power_of_4(n: int) -> int:
    """The smallest power of 4 that is >= n."""
    size = 1
    while size < n:
        size *= 4
    return size


def _need(request: Request) -> int:
    # The last sampled token is never fed back, so it takes no cache slot.
    return len(request.prompt) + request.max_new_tokens - 1


_Row = tuple[int, int, float, list[tuple[int, float]] | None]  # slot, token, logprob, top


def _rows(
    sampled: Sampled, rows: list[int], slots: list[int], requests: list[Request]
) -> list[_Row]:
    """Read rows of a device call's tokens to the host (the alternatives only if asked)."""
    want_top = any(r.top_logprobs for r in requests)
    if want_top:
        token, logprob, ids, values = jax.device_get(sampled)
    else:
        token, logprob = jax.device_get((sampled.token, sampled.logprob))
    out: list[_Row] = []
    for row, slot, r in zip(rows, slots, requests, strict=True):
        top = None
        if r.top_logprobs:
            # Tokens that cannot be drawn (-inf: cut by a filter or the grammar) are left out.
            top = [
                (int(i), float(v))
                for i, v in zip(
                    ids[row, : r.top_logprobs], values[row, : r.top_logprobs], strict=True
                )
                if v > -np.inf
            ]
        out.append((slot, int(token[row]), float(logprob[row]), top))
    return out

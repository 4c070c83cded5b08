"""The built-in rollout engine: continuous batching of an NNX model with a KV cache.

Requests from many concurrent callers share one batch of slots (`Scheduler`): between two
decode steps finished sequences leave and waiting ones join, so a long completion never
holds short ones back and a new request never waits for a whole batch to end. Shapes are
bucketed (`rl_core.rollout.steps`), so a run compiles a handful of programs, not one per
request; sampling parameters and seeds are traced arrays.

Each request may carry OpenAI's frequency and presence penalties, ask for its tokens' top
alternatives (`Completion.top_logprobs`), and follow a grammar (`rl_core.rollout.grammar`:
llguidance, compiled on the host, applied as a token mask on the device). A token's recorded
logprob is always under the distribution it was drawn from: penalised, masked, then shaped by
temperature, top-k and top-p.

All device work runs in one thread (the engine's own, or an executor shared with the
trainer). The driver gives that thread back every ``steps_per_turn`` decode steps, so a
train step queued on a shared executor runs between two decode steps instead of after the
last request. `update_weights` swaps ``(params, version)`` as one tuple, read once per
step: a new policy applies from the next step on, without draining anything.

Built with adapter slots (``EngineConfig.adapter_slots`` and ``lora``), the engine holds
the base once and S LoRA adapters beside it (`rl_core.rollout.adapter_slots`):
`set_adapter` puts one in a slot, and `generate` takes each request's slot (None: the base
alone). Requests of different adapters share the batch, each row computed with its own
adapter unmerged (`rl_core.models.multi_lora`), as it would be with that adapter merged
into the base alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model
from rl_core.models.lora import Adapters, LoraConfig
from rl_core.models.multi_lora import DEFAULT_IMPL
from rl_core.models.tokenizer import Tokenizer
from rl_core.rollout import steps
from rl_core.rollout.adapter_slots import AdapterSlots
from rl_core.rollout.base import (
    Completion,
    Grammar,
    SamplingParams,
    token_limits,
)
from rl_core.rollout.grammar import Constraint, GrammarTokenizer
from rl_core.rollout.sampling import TOP_LOGPROBS
from rl_core.rollout.scheduler import SHRINK_AFTER, Request, Scheduler, SchedulerStats

__all__ = ["EngineConfig", "JaxEngine"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    stop_ids: tuple[int, ...]
    pad_id: int = 0
    # Slot counts of the decode batch: it moves to the smallest that holds the running
    # requests. Two sizes trade a little wasted compute for few compiles.
    batch_buckets: tuple[int, ...] = (8, 64)
    # Decode steps the batch must have fitted a smaller bucket before it shrinks: a
    # multi-turn load swings across buckets as turns end and come back (scheduler.py).
    shrink_after_steps: int = SHRINK_AFTER
    min_prompt_bucket: int = 16  # the shortest packed prefill row
    # Tokens of one packed prefill row. Its attention is quadratic in the row: at 1,024 it
    # cost SmolLM2 more than the padding it saved (64 prompts joining: 1.04x transformers'
    # speed, vs 1.56x padded), at 256 about a twelfth of the row's matmuls. More joining
    # prompts are prefilled in several calls; a longer prompt goes alone.
    max_packed_tokens: int = 256
    min_cache_bucket: int = 64
    max_cache_len: int | None = None  # prompt + new tokens per request; default: the model's
    batch_window_s: float = 0.002  # an idle engine waits this long for concurrent callers
    steps_per_turn: int = 8  # decode steps before the device thread is handed back
    # Rows of the prefix pool: finished sequences whose keys and values are kept for the
    # prompt that continues them (an agent's next turn), so that prompt prefills only its
    # new tokens (`rl_core.rollout.prefix_pool`). None: as many as the largest batch
    # bucket (the pool then takes as much memory as the decode cache at its largest);
    # 0 (the default: on CPU it cost more than it saved, docs/lifecycle.md) turns it off.
    prefix_pool_rows: int | None = 0
    # LoRA adapters served beside the base (0: none): a request names its slot, and
    # requests of different adapters share a batch. ``lora`` gives their rank and targets.
    adapter_slots: int = 0
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.adapter_slots and self.lora is None:
            raise RolloutError("adapter_slots needs lora: the adapters' rank and targets")


class JaxEngine:
    """`RolloutEngine` over an NNX `Model`, with its own device thread unless given one.

    ``tokenizer`` (the run's) is needed for grammars only: llguidance reads it once, at the
    first grammar, to know which tokens spell what.
    """

    def __init__(
        self,
        model: Model,
        *,
        config: EngineConfig,
        executor: Executor | None = None,
        policy_version: int = 0,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        graphdef, state = nnx.split(model)
        self._treedef: Any = jax.tree.structure(state)
        self.adapters: AdapterSlots | None = None
        spec = None
        if config.adapter_slots:
            assert config.lora is not None  # EngineConfig checks it
            self.adapters = AdapterSlots(state, config.lora, config.adapter_slots)
            spec = steps.AdapterSpec(self.adapters.treedef, config.lora, DEFAULT_IMPL)
        self._programs = steps.programs(graphdef, self._treedef, spec)
        self._model_config = model.config
        self.config = config
        self.max_cache_len = config.max_cache_len or model.config.max_seq_len
        self._policy = _Policy(state, policy_version, jax.tree.leaves(state))
        self._swap_lock = threading.Lock()  # `update_adapter` against `_current_policy`
        self._own_executor = executor is None
        self.executor: Executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rl-device"
        )
        self._driver: _Driver | None = None
        self.stats = SchedulerStats()
        self._tokenizer = tokenizer
        self._grammar_tokenizer: GrammarTokenizer | None = None
        self._grammar_lock = threading.Lock()

    @property
    def policy_version(self) -> int:
        return self._policy.version

    @property
    def policy(self) -> Any:
        """The weights the engine samples with now (an `nnx.State` of the model)."""
        return self._policy.params

    def update_weights(self, params: Any, version: int) -> None:
        leaves, treedef = jax.tree.flatten(params)
        if treedef != self._treedef:
            raise RolloutError(
                "update_weights got weights of another structure than the engine's model; "
                "pass the state of the same model (nnx.state(model))"
            )
        self._policy = _Policy(params, version, leaves)  # one assignment: read once per step

    def set_adapter(self, slot: int, adapters: Adapters) -> None:
        """Slot ``slot`` samples with ``adapters`` (`rl_core.models.lora` layout, the engine's
        rank and targets) from its next request on; its parked prefixes are forgotten.
        `RolloutError` while a request of that slot is in flight."""
        self._slots().set(slot, adapters)

    def update_adapter(self, slot: int, adapters: Adapters, version: int) -> None:
        """The live policy is the base with ``adapters`` in ``slot``, as ``version``: like
        `update_weights`, it applies from the next decode step, to requests in flight too,
        and the adapter and the version change together (one device call never reads the
        new adapter under the old version, or the reverse)."""
        with self._swap_lock:
            self._slots().swap(slot, adapters)
            policy = self._policy
            self._policy = _Policy(policy.params, version, policy.leaves)

    def clear_adapter(self, slot: int) -> None:
        """Slot ``slot`` holds no adapter any more (it samples as the base)."""
        self._slots().clear(slot)

    def _slots(self) -> AdapterSlots:
        if self.adapters is None:
            raise RolloutError("this engine has no adapter slots (EngineConfig.adapter_slots)")
        return self.adapters

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[JaxEngine]:
        """Continuously batch `generate` calls from concurrent tasks while the block runs."""
        driver = _Driver(self._scheduler(), self.executor, asyncio.get_running_loop(), self.config)
        self._driver = driver
        try:
            yield self
        finally:
            self._driver = None
            driver.close()

    @property
    def batches_run(self) -> int:
        """Prefill calls so far: groups of requests that joined the batch together."""
        return self.stats.prefill_calls + self.stats.extend_calls

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
        adapter_slot: int | Sequence[int | None] | None = None,
    ) -> list[Completion]:
        """Continue each prompt; ``adapter_slot`` is the adapter slot of every prompt, or of
        each (None or -1: the base alone)."""
        constraints: list[Constraint | None] | None = None
        if grammars is not None and len(grammars) != len(prompts):
            raise RolloutError(f"{len(grammars)} grammars for {len(prompts)} prompts")
        if grammars is not None and any(g is not None for g in grammars):
            # Compiling a grammar takes milliseconds to a second: off the event loop.
            constraints = await asyncio.to_thread(self._compile, grammars, len(prompts))
        requests = self._requests(
            prompts, max_new_tokens, sampling, seeds, constraints, top_logprobs
        )
        with self._holding(requests, adapter_slot):
            if self._driver is not None:
                return await self._driver.submit(requests)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self._run_to_end, requests)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
        adapter_slot: int | Sequence[int | None] | None = None,
    ) -> list[Completion]:
        """Synchronous `generate`, on the calling thread (tests, scripts)."""
        constraints = None if grammars is None else self._compile(grammars, len(prompts))
        requests = self._requests(
            prompts, max_new_tokens, sampling, seeds, constraints, top_logprobs
        )
        with self._holding(requests, adapter_slot):
            return self._run_to_end(requests)

    @contextlib.contextmanager
    def _holding(
        self, requests: list[Request], adapter_slot: int | Sequence[int | None] | None
    ) -> Iterator[None]:
        """Give each request its adapter slot and hold the slots until the block ends."""
        if isinstance(adapter_slot, int) or adapter_slot is None:
            wanted: list[int | None] = [adapter_slot] * len(requests)
        else:
            wanted = list(adapter_slot)
            if len(wanted) != len(requests):
                raise RolloutError(f"{len(wanted)} adapter slots for {len(requests)} prompts")
        slots = [None if s is None or s == -1 else int(s) for s in wanted]
        if all(s is None for s in slots):
            yield
            return
        held = self._slots().claim(slots)
        for r, (slot, version) in zip(requests, held, strict=True):
            r.adapter, r.adapter_version = slot, version
        try:
            yield
        finally:
            self._slots().release(slots)

    def _compile(
        self, grammars: Sequence[Grammar | None], n: int
    ) -> list[Constraint | None] | None:
        """A matcher per grammar; `RolloutError` with llguidance's reason for a bad one."""
        if len(grammars) != n:
            raise RolloutError(f"{len(grammars)} grammars for {n} prompts")
        if all(g is None for g in grammars):
            return None
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                if self._tokenizer is None:
                    raise RolloutError(
                        "this JAX engine was built without the run's tokenizer; grammars need it"
                    )
                self._grammar_tokenizer = GrammarTokenizer(
                    self._tokenizer,
                    vocab=self._model_config.vocab_size,
                    stop_ids=self.config.stop_ids,
                )
        tok = self._grammar_tokenizer
        return [None if g is None else tok.compile(g) for g in grammars]

    def close(self) -> None:
        if self._own_executor:
            self.executor.shutdown(wait=True)

    def _scheduler(self) -> Scheduler:
        c = self.config
        return Scheduler(
            self._programs,
            self._model_config,
            policy=self._current_policy,
            stop_ids=c.stop_ids,
            pad_id=c.pad_id,
            row_buckets=c.batch_buckets,
            min_prompt_bucket=c.min_prompt_bucket,
            max_packed_tokens=c.max_packed_tokens,
            min_cache_bucket=c.min_cache_bucket,
            max_cache_len=self.max_cache_len,
            prefix_rows=max(c.batch_buckets) if c.prefix_pool_rows is None else c.prefix_pool_rows,
            shrink_after=c.shrink_after_steps,
            stats=self.stats,
            adapter_slots=c.adapter_slots,
            adapter_versions=None if self.adapters is None else self._adapter_versions,
        )

    def _current_policy(self) -> tuple[steps.Weights, int]:
        if self.adapters is None:
            policy = self._policy  # read once: update_weights may swap it between two reads
            return steps.Weights(policy.leaves, None), policy.version
        with self._swap_lock:
            policy, adapters = self._policy, self.adapters.leaves
        return steps.Weights(policy.leaves, adapters), policy.version

    def _adapter_versions(self) -> tuple[int, ...]:
        assert self.adapters is not None
        return self.adapters.versions

    def _run_to_end(self, requests: list[Request]) -> list[Completion]:
        scheduler = self._scheduler()
        for r in requests:
            scheduler.add(r)
        results: dict[int, Completion] = {}
        while scheduler.busy:
            for request, completion in scheduler.step():
                results[id(request)] = completion
        return [results[id(r)] for r in requests]

    def _requests(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        constraints: Sequence[Constraint | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Request]:
        limits = token_limits(prompts, max_new_tokens, seeds)
        if not 0 <= top_logprobs <= TOP_LOGPROBS:
            raise RolloutError(f"top_logprobs must be between 0 and {TOP_LOGPROBS}")
        penalties = (sampling.frequency_penalty, sampling.presence_penalty)
        if not all(math.isfinite(p) for p in penalties):
            raise RolloutError("frequency_penalty and presence_penalty must be finite numbers")
        constraints = constraints or [None] * len(prompts)
        for p, m in zip(prompts, limits, strict=True):
            if len(p) + m - 1 > self.max_cache_len:
                raise RolloutError(
                    f"a prompt of {len(p)} tokens plus max_new_tokens={m} exceeds the engine's "
                    f"max_cache_len={self.max_cache_len}; shorten agent.max_context or "
                    f"agent.max_new_tokens"
                )
        return [
            Request(
                prompt=list(p),
                max_new_tokens=int(m),
                sampling=sampling,
                seed=int(s),
                constraint=c,
                top_logprobs=top_logprobs,
            )
            for p, m, s, c in zip(prompts, limits, seeds, constraints, strict=True)
        ]


class _Policy(NamedTuple):
    params: Any
    version: int
    leaves: list[Any]  # params flattened once here, not on every device call


class _Driver:
    """Feeds requests from the event loop to a `Scheduler` stepped in the device thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        loop: asyncio.AbstractEventLoop,
        config: EngineConfig,
    ) -> None:
        self._scheduler, self._executor, self._loop = scheduler, executor, loop
        self._window_s, self._steps_per_turn = config.batch_window_s, config.steps_per_turn
        self._inbox: deque[Request] = deque()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False

    async def submit(self, requests: list[Request]) -> list[Completion]:
        for r in requests:
            r.future = self._loop.create_future()
            self._inbox.append(r)
        with self._lock:
            start = not self._running
            self._running = True
        if start:
            self._executor.submit(self._drive, True)
        return list(await asyncio.gather(*(r.future for r in requests if r.future)))

    def close(self) -> None:
        """Stop stepping; callers still waiting are cancelled (on the loop thread)."""
        self._closed = True
        for r in list(self._inbox):
            if r.future is not None:
                r.future.cancel()

    def _drive(self, fresh: bool) -> None:
        if fresh and self._window_s:
            time.sleep(self._window_s)  # let the callers of the same tick join one prefill
        try:
            for _ in range(self._steps_per_turn):
                if self._closed:
                    self._fail(self._scheduler.fail_all(), None)
                    return self._stop()
                while self._inbox:
                    self._scheduler.add(self._inbox.popleft())
                if not self._scheduler.busy:
                    with self._lock:
                        if not self._inbox:
                            self._running = False
                            return None
                    continue
                for request, completion in self._scheduler.step():
                    self._deliver(request, completion)
        except Exception as exc:
            self._fail(self._scheduler.fail_all(), exc)
        try:  # back of the queue: work waiting on a shared device thread runs now
            self._executor.submit(self._drive, False)
        except RuntimeError:  # the executor shut down under us
            self._fail(self._scheduler.fail_all(), None)
            self._stop()
        return None

    def _stop(self) -> None:
        with self._lock:
            self._running = False

    def _deliver(self, request: Request, completion: Completion) -> None:
        future = request.future
        if future is None:
            return

        def resolve() -> None:
            if not future.done():
                future.set_result(completion)

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            self._loop.call_soon_threadsafe(resolve)

    def _fail(self, requests: list[Request], exc: Exception | None) -> None:
        for request in requests:
            future = request.future
            if future is None:
                continue

            def fail(f: asyncio.Future[Completion] = future) -> None:
                if not f.done():
                    f.set_exception(exc) if exc is not None else f.cancel()

            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fail)

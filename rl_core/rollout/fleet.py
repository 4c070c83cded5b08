"""A run's rollouts served by R engine servers at once (`RolloutFleet`).

The fleet is a `RolloutEngine` over R member engines (`VllmEngine`s, each over its own
vLLM server, started with ``recover_in_place=False``). Each prompt goes to one member:

- **By cached prefix, then by load.** Every finished request leaves its tokens (prompt and
  completion) in a `PrefixRoutes` index, hashed block by block. An agent's next turn is its
  last prompt and completion plus the new observation, so the member that served the last
  turn holds its prefix in vLLM's prefix cache; the prompt goes there, unless that member
  has ``slack`` more requests outstanding than the least loaded one (then the least loaded
  takes it: a cache hit is worth less than waiting behind a queue). A prompt no member has
  seen goes to the least loaded member.
- **A weight update reaches every member**, in parallel, from one copy of the weight
  files (written once, `VllmEngine.prepare`), each checked by its own probe
  (`VllmEngine.publish`); the update returns once all are on the new version.
- **A member whose server dies is taken out**: its requests in flight fail with
  `EngineUnavailable`, and are sent again to the other members (a request's seed goes
  with it, so nothing is lost and nothing is counted twice: a failed request returned
  nothing). On a thread of its own the member is restarted onto the newest weights
  (`VllmEngine.recover`), checked, and put back. The run stops only when no
  member is left and none comes back within ``recovery_timeout_s``, or one has been
  recovered more than ``max_recoveries`` times.

Fleet metrics after each update (`update_metrics`): members up, requests each served
since the last update and their skew (most over mean: 1 is even), requests sent again,
recoveries, and the slowest member's update figures (an update is as long as its
slowest member's).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from rl_core.errors import RolloutError
from rl_core.rollout.base import (
    Completion,
    Grammar,
    RolloutEngine,
    SamplingParams,
    token_limits,
)
from rl_core.rollout.vllm_engine import EngineUnavailable, PreparedWeights

__all__ = ["FleetMember", "PrefixRoutes", "RolloutFleet"]

log = logging.getLogger(__name__)

BLOCK = 16  # tokens per hashed block of a routed prefix (vLLM's prefix cache block size)


class FleetMember(RolloutEngine, Protocol):
    """What the fleet needs of a member engine beside sampling (`VllmEngine` has it): the
    weights written once for all (`prepare`), loaded by each (`publish`), and a restart
    onto the newest (`recover`)."""

    def prepare(self, params: Any, version: int) -> PreparedWeights: ...

    def publish(self, prepared: PreparedWeights, *, owned: bool) -> None: ...

    def recover(self, why: str, weights: PreparedWeights | None = None) -> None: ...


class PrefixRoutes:
    """Which member last served each prefix, by chained hashes of ``BLOCK``-token blocks.

    A sequence's block hashes chain (each covers every token before it), so the longest
    known prefix of a prompt is found by walking its blocks, one hash each. At most
    ``capacity`` blocks are remembered, the least recently used forgotten first.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._routes: collections.OrderedDict[int, int] = collections.OrderedDict()

    @staticmethod
    def blocks(tokens: Sequence[int]) -> list[int]:
        hashes, h = [], 0
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            h = hash((h, tuple(tokens[start : start + BLOCK])))
            hashes.append(h)
        return hashes

    def record(self, tokens: Sequence[int], member: int) -> None:
        for h in self.blocks(tokens):
            self._routes[h] = member
            self._routes.move_to_end(h)
        while len(self._routes) > self.capacity:
            self._routes.popitem(last=False)

    def longest(self, tokens: Sequence[int]) -> tuple[int | None, int]:
        """(member, blocks matched) of the longest remembered prefix of ``tokens``."""
        found: int | None = None
        matched = 0
        for i, h in enumerate(self.blocks(tokens)):
            member = self._routes.get(h)
            if member is None:
                break
            found, matched = member, i + 1
        return found, matched

    def forget(self, member: int) -> None:
        """A restarted server's cache is empty: route nothing to it by prefix."""
        for h in [h for h, m in self._routes.items() if m == member]:
            del self._routes[h]


class RolloutFleet:
    """`RolloutEngine` over ``members``; see the module docstring."""

    def __init__(
        self,
        members: Sequence[FleetMember],
        *,
        slack: int = 8,
        recovery_timeout_s: float = 300.0,
        max_recoveries: int = 3,
    ) -> None:
        if not members:
            raise RolloutError("a fleet needs at least one engine")
        self.members = list(members)
        self.slack = slack
        self.recovery_timeout_s = recovery_timeout_s
        self.max_recoveries = max_recoveries
        self.routes = PrefixRoutes()
        n = len(self.members)
        self.up = [True] * n
        self.outstanding = [0] * n
        self.served = [0] * n  # requests served since the last update
        self.recoveries = [0] * n
        self.resent = 0  # requests sent again after their member went down
        self._lock = threading.Lock()  # up, outstanding, routes: event loop and threads
        self._update_s = 0.0
        self._latest: PreparedWeights | None = None  # the newest weights, written once
        self._failure: BaseException | None = None  # a member that could not come back
        self._recovering: set[int] = set()
        self._stale: list[Path] = []  # folders of replaced versions, deleted by _drop_stale
        self._threads = ThreadPoolExecutor(max_workers=n, thread_name_prefix="rl-fleet")

    @property
    def policy_version(self) -> int:
        with self._lock:
            versions = [m.policy_version for m, up in zip(self.members, self.up, strict=True) if up]
        return min(versions) if versions else self.members[0].policy_version

    # --- generation -----------------------------------------------------------------

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        limits = token_limits(prompts, max_new_tokens, seeds)
        each = list(grammars) if grammars is not None else [None] * len(prompts)
        if len(each) != len(prompts):
            raise RolloutError(f"{len(each)} grammars for {len(prompts)} prompts")
        return list(
            await asyncio.gather(
                *(
                    self._one(list(p), m, sampling, s, g, top_logprobs)
                    for p, m, s, g in zip(prompts, limits, seeds, each, strict=True)
                )
            )
        )

    async def _one(
        self,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
        grammar: Grammar | None,
        top_logprobs: int,
    ) -> Completion:
        while True:
            member = await self._choose(prompt)
            try:
                (completion,) = await self.members[member].generate(
                    [prompt],
                    max_new_tokens=max_new_tokens,
                    sampling=sampling,
                    seeds=[seed],
                    grammars=[grammar],
                    top_logprobs=top_logprobs,
                )
            except EngineUnavailable as exc:
                self._down(member, str(exc))
                with self._lock:
                    self.resent += 1
                continue  # to another member: the request returned nothing
            finally:
                with self._lock:
                    self.outstanding[member] -= 1
            with self._lock:
                self.served[member] += 1
                self.routes.record(prompt + list(completion.tokens), member)
            return completion

    async def _choose(self, prompt: list[int]) -> int:
        """The member for ``prompt`` (its load counted); waits while none is up."""
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            with self._lock:
                if self._failure is not None:
                    raise RolloutError(str(self._failure)) from self._failure
                live = [i for i, up in enumerate(self.up) if up]
                if live:
                    member = self._pick(prompt, live)
                    self.outstanding[member] += 1
                    return member
            if time.monotonic() > deadline:
                raise RolloutError(
                    f"no rollout server of the fleet's {len(self.members)} came back within "
                    f"{self.recovery_timeout_s:.0f} s"
                )
            await asyncio.sleep(0.2)

    def _pick(self, prompt: list[int], live: list[int]) -> int:
        least = min(live, key=lambda i: (self.outstanding[i], self.served[i]))
        cached, _ = self.routes.longest(prompt)
        if (
            cached is not None
            and cached in live
            and self.outstanding[cached] <= self.outstanding[least] + self.slack
        ):
            return cached
        return least

    # --- members that die -------------------------------------------------------------

    def _down(self, member: int, why: str) -> None:
        """Take ``member`` out and bring it back on a thread of its own (once)."""
        with self._lock:
            self.up[member] = False
            if member in self._recovering:
                return
            self._recovering.add(member)
        log.warning("rollout server %d of %d is down (%s); taken out", member, len(self.up), why)
        self._threads.submit(self._recover, member, why)

    def _recover(self, member: int, why: str) -> None:
        engine = self.members[member]
        try:
            with self._lock:
                self.recoveries[member] += 1
                if self.recoveries[member] > self.max_recoveries:
                    raise RolloutError(
                        f"rollout server {member} went down again after "
                        f"{self.max_recoveries} recoveries this run ({why}); giving up"
                    )
                latest = self._latest
            # Restarted, onto the newest weights (not those it had), checked.
            engine.recover("taken out of its fleet", latest)
            while True:  # an update that went on meanwhile: it catches up before it is back
                with self._lock:  # checked and put back at once: no update slips between
                    latest = self._latest
                    if latest is None or engine.policy_version == latest.version:
                        self.routes.forget(member)
                        self.up[member] = True
                        self._recovering.discard(member)
                        break
                engine.publish(latest, owned=False)
            self._drop_stale()
            log.warning("rollout server %d is back (%s)", member, why)
        except BaseException as exc:
            log.exception("rollout server %d could not be recovered", member)
            with self._lock:
                self._failure = exc
                self._recovering.discard(member)

    # --- weights ------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        """Every member up takes ``version`` (in parallel), from one copy of the weight
        files; a member that goes down during the update is taken out and catches up when
        it comes back. The files of the version before are deleted once all have moved."""
        started = time.perf_counter()
        with self._lock:
            if self._failure is not None:
                raise RolloutError(str(self._failure)) from self._failure
        prepared = self.members[0].prepare(params, version)  # writes files only
        with self._lock:
            previous, self._latest = self._latest, prepared
            live = [i for i, up in enumerate(self.up) if up]
        futures = {
            i: self._threads.submit(self.members[i].publish, prepared, owned=False) for i in live
        }
        for i, future in futures.items():
            try:
                future.result()
            except EngineUnavailable as exc:
                self._down(i, str(exc))
        if previous is not None:
            with self._lock:
                self._stale.append(previous.folder)
            self._drop_stale()
        self._update_s = time.perf_counter() - started

    def _drop_stale(self) -> None:
        """Delete the files of replaced versions, unless a member is being recovered (it
        may be loading the version it read before the newest arrived)."""
        with self._lock:
            if self._recovering:
                return
            stale, self._stale = self._stale, []
        for folder in stale:
            shutil.rmtree(folder, ignore_errors=True)

    def update_metrics(self) -> dict[str, float]:
        with self._lock:
            served, self.served = self.served, [0] * len(self.members)
            up = sum(self.up)
            resent, recoveries = self.resent, sum(self.recoveries)
        mean = sum(served) / len(served)
        metrics = {
            "fleet/servers_up": float(up),
            "fleet/requests_skew": max(served) / mean if mean else 1.0,
            "fleet/resent": float(resent),
            "fleet/recoveries": float(recoveries),
            "fleet/update_s": self._update_s,
        }
        for i, n in enumerate(served):
            metrics[f"fleet/server_{i}/requests"] = float(n)
        # An update is as long as its slowest member's: the largest of each member figure.
        for member in self.members:
            figures = getattr(member, "update_metrics", None)
            for name, value in (figures() if figures else {}).items():
                metrics[name] = max(metrics.get(name, value), value)
        return metrics

    # --- lifecycle --------------------------------------------------------------------

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[RolloutFleet]:
        async with AsyncExitStack() as stack:
            for member in self.members:
                serving = getattr(member, "serving", None)
                if serving is not None:
                    await stack.enter_async_context(serving())
            yield self

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        self._drop_stale()
        for member in self.members:
            closing = getattr(member, "close", None)
            if closing is not None:
                closing()

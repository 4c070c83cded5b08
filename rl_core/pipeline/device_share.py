"""Fair turns on one accelerator for the runs that share a process (`DeviceShare`).

A worker that hosts several runs on one base model (docs/shared-base.md) gives each run
its own `DeviceThread`, and the threads of different runs would race for the device:
whoever calls most often would take most of it. `DeviceShare` makes them take turns,
fairly by device time: when the device is free, the waiting call whose run has used the
least device time so far goes next (ties: first come). A run that joins starts level
with the least-served run rather than at zero, and one that comes back after more than
``bank_s`` without asking (its episodes waited on environments) is at most ``bank_s``
behind the least-served other run: neither can take the device for as long as the
others have used it meanwhile, while a run kept waiting by another's long call keeps
all of its due. It is the rule of
Linux's completely fair scheduler, over device calls instead of time slices: a call is
never cut short, so one long train step holds the device while it runs, and the runs it
delayed are served first afterwards.

``capacity`` calls may hold the device at once: 1 for an accelerator, whose calls queue
on it anyway; on the CPU backend (`Colocation`'s default) one per core, since XLA runs
two small programs on two cores side by side, and one at a time leaves a core idle
(bench/t1_job_runs.py, two tiny runs at once against the same on their own copies
without turns: 0.79x their throughput one call at a time, 0.87x two at once).

Pure host code (threads and a condition); the device work itself runs in the callers'
threads.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class _Account:
    used_s: float = 0.0  # device seconds, counted from the level the run joined at
    calls: int = 0
    last_end: float = 0.0  # when its last call ended (the clock's time)


class DeviceShare:
    """Turns on the device for the runs of one process, by least device time used."""

    def __init__(
        self,
        *,
        capacity: int = 1,
        bank_s: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity, self._bank_s, self._clock = capacity, bank_s, clock
        self._cond = threading.Condition()
        self._accounts: dict[str, _Account] = {}
        self._waiting: list[tuple[int, str]] = []  # (ticket, owner)
        self._tickets = itertools.count()
        self._holding = 0  # calls on the device now

    def join(self, owner: str) -> None:
        """``owner`` (a run) takes turns from now on, level with the least-served run."""
        with self._cond:
            self._accounts[owner] = _Account(used_s=self._floor(owner), last_end=self._clock())

    def leave(self, owner: str) -> None:
        with self._cond:
            self._accounts.pop(owner, None)
            self._cond.notify_all()

    @contextlib.contextmanager
    def turn(self, owner: str) -> Iterator[None]:
        """Hold the device for one call of ``owner``; waits for its turn."""
        with self._cond:
            account = self._accounts.get(owner)
            if account is None:
                raise KeyError(f"{owner!r} has not joined this device share")
            if self._clock() - account.last_end > self._bank_s:
                # Back from a pause (its episodes waited on environments): it banks at
                # most bank_s of the device time it did not ask for.
                account.used_s = max(account.used_s, self._floor(owner) - self._bank_s)
            me = (next(self._tickets), owner)
            self._waiting.append(me)
            while self._holding >= self._capacity or self._next() != me:
                self._cond.wait()
            self._waiting.remove(me)
            self._holding += 1
        started = self._clock()
        try:
            yield
        finally:
            ended = self._clock()
            with self._cond:
                self._holding -= 1
                held = self._accounts.get(owner)
                if held is not None:
                    held.used_s += ended - started
                    held.calls += 1
                    held.last_end = ended
                self._cond.notify_all()

    def used(self) -> dict[str, float]:
        """Device seconds each run has held, since it joined (offset by its joining level)."""
        with self._cond:
            return {owner: a.used_s for owner, a in self._accounts.items()}

    def _next(self) -> tuple[int, str]:
        """The waiting call to run next: its run's least device time, then first come."""

        def key(waiter: tuple[int, str]) -> tuple[float, int]:
            account = self._accounts.get(waiter[1])
            return (account.used_s if account is not None else 0.0, waiter[0])

        return min(self._waiting, key=key)

    def _floor(self, owner: str) -> float:
        """The least device time among the other runs (0 when there is none)."""
        return min((a.used_s for o, a in self._accounts.items() if o != owner), default=0.0)


__all__ = ["DeviceShare"]

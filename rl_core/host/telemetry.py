"""Stage spans: cheap enough to leave on, exported as a Chrome trace, mirrored into jax.profiler.

`SpanRecorder` is the one place a run's timing goes. Recording a span is a
clock read and a list append under a lock (the device thread records too), so
it stays on in every run; the pipeline drains the buffer into
``sink.on_spans`` once per step. Per stage it also keeps running totals, which
the pipeline turns into the per-step ``time/<stage>_s`` metrics.

Spans of synchronous work (device calls, checkpoints) also open a
``jax.profiler.TraceAnnotation`` of the same name, so an XProf trace taken on
demand (`Profiler`) lines up with the timeline. Spans that cross awaits
(model calls, environment steps) cannot: an annotation is a thread-local
stack, and interleaved episodes on one event loop would corrupt it.

Nothing here imports JAX at import time: the CLI imports the runner, which
imports this module, for ``--help``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.records import STAGES, Span

log = logging.getLogger(__name__)

ArgValue = str | int | float | bool


def now_us() -> int:
    """Wall-clock microseconds (Unix epoch): spans of several processes share one axis."""
    return time.time_ns() // 1000


class SpanRecorder:
    """A thread-safe buffer of spans, bounded so a run whose sink stalls cannot grow without end.

    Past ``capacity`` unread spans the oldest are discarded and counted in
    ``dropped``; stage totals keep counting either way.
    """

    def __init__(self, *, capacity: int = 200_000) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self._capacity = capacity
        self.dropped = 0
        self._totals: dict[str, float] = dict.fromkeys(STAGES, 0.0)

    def add(
        self,
        name: str,
        *,
        start_us: int,
        dur_us: int,
        track: str,
        step: int,
        args: Mapping[str, ArgValue] | None = None,
    ) -> None:
        span = Span(
            name=name,
            start_us=start_us,
            dur_us=max(0, dur_us),
            track=track,
            step=step,
            args=dict(args) if args else None,
        )
        with self._lock:
            self._spans.append(span)
            self._totals[name] = self._totals.get(name, 0.0) + span.dur_us / 1e6
            if len(self._spans) > self._capacity:
                excess = len(self._spans) - self._capacity
                del self._spans[:excess]
                self.dropped += excess

    @contextlib.contextmanager
    def span(
        self, name: str, *, track: str, step: int, annotate: bool = False, **args: ArgValue
    ) -> Iterator[dict[str, ArgValue]]:
        """Time the block; the yielded dict may gain args on the way (an error, a count).

        ``annotate`` also opens a jax.profiler annotation: only for blocks that
        do not await (see the module docstring).
        """
        extra: dict[str, ArgValue] = dict(args)
        start_us, t0 = now_us(), time.perf_counter_ns()
        try:
            with _annotation(name) if annotate else contextlib.nullcontext():
                yield extra
        except BaseException as exc:
            extra.setdefault("error", type(exc).__name__)
            raise
        finally:
            dur_us = (time.perf_counter_ns() - t0) // 1000
            self.add(name, start_us=start_us, dur_us=dur_us, track=track, step=step, args=extra)

    def drain(self) -> list[Span]:
        with self._lock:
            spans, self._spans = self._spans, []
        return spans

    def totals(self) -> dict[str, float]:
        """Seconds spent in each stage since the recorder was made (summed over tracks)."""
        with self._lock:
            return dict(self._totals)


def _annotation(name: str) -> contextlib.AbstractContextManager[Any]:
    # Only where JAX is already loaded (the device side); never import it for a span.
    jax = sys.modules.get("jax")
    if jax is None:
        return contextlib.nullcontext()
    return jax.profiler.TraceAnnotation(name)  # type: ignore[no-any-return]


def chrome_trace(spans: Iterable[Span]) -> dict[str, Any]:
    """Chrome trace-event JSON (Perfetto, chrome://tracing): one thread row per track.

    The shape is the control plane's ``GET /v1/runs/{id}/timeline``: complete
    ("X") events with ``tid`` numbered per track, plus ``thread_name`` metadata.
    """
    tids: dict[str, int] = {}
    events = [
        trace_event(span, tids.setdefault(span.track, len(tids) + 1))
        for span in sorted(spans, key=lambda s: s.start_us)
    ]
    meta = [track_event(track, tid) for track, tid in tids.items()]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def trace_event(span: Span, tid: int) -> dict[str, Any]:
    """One span as a complete ("X") trace event on thread row ``tid``."""
    return {
        "name": span.name,
        "cat": "stage",
        "ph": "X",
        "ts": span.start_us,
        "dur": span.dur_us,
        "pid": 1,
        "tid": tid,
        "args": {"step": span.step, **(span.args or {})},
    }


def track_event(track: str, tid: int) -> dict[str, Any]:
    """The metadata event that names thread row ``tid`` after its track."""
    return {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}}


class Profiler:
    """On-demand jax.profiler traces over the next N train steps, under ``directory``.

    Asked for through `RunControl.request_profile`; `begin_step` starts a trace
    when a request is pending, `end_step` stops it after the N-th step. A run
    without an artifacts folder has nowhere to put one, so it logs and skips.
    """

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._remaining = 0
        self.active_path: Path | None = None
        self.written: list[Path] = []

    def begin_step(self, step: int, requested_steps: int) -> None:
        if requested_steps <= 0 or self.active_path is not None:
            self._remaining = max(self._remaining, requested_steps)
            return
        if self.directory is None:
            log.warning("profile of %d steps requested, but the run has no artifacts_dir", step)
            return
        import jax

        path = self.directory / f"step-{step:08d}"
        path.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(str(path))
        self.active_path, self._remaining = path, requested_steps

    def end_step(self) -> Path | None:
        """Stop the trace if this was its last step; returns the finished trace's folder."""
        if self.active_path is None:
            return None
        self._remaining -= 1
        return self.stop() if self._remaining <= 0 else None

    def stop(self) -> Path | None:
        if self.active_path is None:
            return None
        import jax

        jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
        path, self.active_path, self._remaining = self.active_path, None, 0
        self.written.append(path)
        return path


def fractions(busy_s: float, blocked_s: float, wall_s: float) -> tuple[float, float, float]:
    """(busy, blocked, idle) shares of ``wall_s``, clamped so they sum to 1.

    Work is attributed to the step in which it finished, so a call that spans
    a step boundary can push a share past 1; the clamp keeps the report sane.
    """
    if wall_s <= 0:
        return 0.0, 0.0, 1.0
    busy = min(1.0, max(0.0, busy_s / wall_s))
    blocked = min(1.0 - busy, max(0.0, blocked_s / wall_s))
    return busy, blocked, 1.0 - busy - blocked


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


__all__ = ["Profiler", "SpanRecorder", "chrome_trace", "fractions", "now_us", "percentile"]

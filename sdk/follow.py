"""Follow a run in the terminal: its status, a progress bar and the live key metrics.

Fed by the run's live stream (``Client.stream``), which resumes by itself after
a dropped connection; a control plane without the stream is polled instead.
On a terminal it redraws in place; piped to a file it prints a line per step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from sdk.client import Client, Run
from sdk.errors import NotFound
from sdk.models import MetricsStep, StatusChange, StreamEvent

REWARD = "reward/mean"
# Shown first when present, in this order; then up to a few of the others.
KEY_METRICS = (
    REWARD,
    "loss",
    "kl",
    "mismatch_kl",
    "staleness/max",
    "tokens_per_s",
    "trajectories_per_s",
    "step_time_s",
)
MAX_ROWS = 10
HISTORY = 40
# `rlaas runs watch` exits with the run's outcome (2 is the CLI's own usage error).
EXIT_CODES = {"succeeded": 0, "failed": 1, "cancelled": 3}
STATUS_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}


class RunWatch:
    """What the terminal shows about one run, updated from stream events."""

    def __init__(self, run: Run) -> None:
        self.run_id = run.id
        self.status = run.status
        self.total = run.total_steps
        self.step = run.current_step
        self.history: dict[str, list[float]] = {}  # the last HISTORY values, for sparklines
        self.first: dict[str, float] = {}  # over the whole run, for the summary
        self.best: dict[str, float] = {}
        self.note = ""
        self.started = time.monotonic()
        # Live's refresh thread renders while the stream applies events.
        self.lock = threading.Lock()

    def apply(self, event: StreamEvent) -> None:
        with self.lock:
            self._apply(event)

    def _apply(self, event: StreamEvent) -> None:
        if isinstance(event, MetricsStep):
            self.step = max(self.step, event.step)
            for name, value in event.metrics.items():
                series = self.history.setdefault(name, [])
                series.append(value)
                del series[:-HISTORY]
                self.first.setdefault(name, value)
                self.best[name] = max(value, self.best.get(name, value))
            self.note = ""
        else:
            self.status = event.status

    def names(self) -> list[str]:
        first = [n for n in KEY_METRICS if n in self.history]
        rest = sorted(n for n in self.history if n not in first and not n.startswith("time/"))
        return (first + rest)[:MAX_ROWS]

    def render(self) -> RenderableType:
        head = Text.assemble(
            (f"{self.status:<9}", f"bold {STATUS_STYLE.get(self.status, '')}"),
            f" {self.run_id}  step {self.step}" + (f" / {self.total}" if self.total else ""),
            f"  {time.monotonic() - self.started:,.0f}s",
        )
        parts: list[RenderableType] = [head]
        if self.total:
            parts.append(ProgressBar(total=self.total, completed=min(self.step, self.total)))
        table = Table(box=None, show_header=False, pad_edge=False)
        for name in self.names():
            values = self.history[name]
            table.add_row(name, f"{values[-1]:.4g}", sparkline(values))
        parts.append(table)
        if self.note:
            parts.append(Text(self.note, style="yellow"))
        return Group(*parts)

    def __rich__(self) -> RenderableType:
        # Live redraws this several times a second, so the clock runs between steps too.
        with self.lock:
            return self.render()

    def line(self, event: StreamEvent) -> str:
        if isinstance(event, StatusChange):
            return f"status {event.status}"
        shown = " ".join(f"{n} {event.metrics[n]:.4g}" for n in self.names() if n in event.metrics)
        total = f"/{self.total}" if self.total else ""
        return f"step {event.step}{total} {shown}"


def follow_run(
    client: Client,
    run_id: str,
    *,
    console: Console | None = None,
    max_reconnects: int | None = None,
    poll_interval_s: float = 1.0,
) -> Run:
    """Show the run live until it ends; returns the final run."""
    console = console or Console(stderr=True)
    watch = RunWatch(client.get_run(run_id))

    def reconnecting(failures: int, last: int | None, error: BaseException | None) -> None:
        why = "the server closed the stream" if error is None else f"connection lost ({error})"
        watch.note = f"{why}; resuming after step {last} (try {failures})"
        if not console.is_terminal:
            console.print(watch.note)

    events: Iterable[StreamEvent] = client.stream(
        run_id, max_reconnects=max_reconnects, on_reconnect=reconnecting
    )
    try:
        _show(console, watch, events)
    except NotFound as exc:
        if exc.code != "no_route":
            raise
        # An older control plane with no stream: poll it.
        _show(console, watch, _polled(client, run_id, watch, poll_interval_s))
    run = client.get_run(run_id)
    if REWARD in watch.first:
        first, best, last = watch.first[REWARD], watch.best[REWARD], watch.history[REWARD][-1]
        console.print(f"{REWARD}: first {first:.3f}, best {best:.3f}, last {last:.3f}")
    style = STATUS_STYLE.get(run.status, "")
    console.print(f"run {run.id} [{style}]{run.status}[/{style}] at step {run.current_step}")
    if run.error:
        console.print(f"[red]error:[/red] {run.error}")
    return run


def _show(console: Console, watch: RunWatch, events: Iterable[StreamEvent]) -> None:
    if not console.is_terminal:
        for event in events:
            watch.apply(event)
            console.print(watch.line(event), highlight=False)
        return
    from rich.live import Live

    with Live(watch, console=console, refresh_per_second=4):
        for event in events:
            watch.apply(event)


def _polled(
    client: Client, run_id: str, watch: RunWatch, interval_s: float
) -> Iterator[StreamEvent]:
    """The stream's events, made by polling the run and its metrics."""
    last = watch.step
    while True:
        run = client.get_run(run_id)
        by_step: dict[int, dict[str, float]] = {}
        for point in client.metrics(run_id, since_step=last + 1):
            by_step.setdefault(point.step, {})[point.name] = point.value
        for step in sorted(by_step):
            last = step
            yield MetricsStep(step=step, metrics=by_step[step])
        if run.status != watch.status:
            yield StatusChange(status=run.status)
        if run.done:
            return
        time.sleep(interval_s)


def sparkline(values: list[float]) -> str:
    """A one-line chart of the values, scaled to their own range."""
    if not values:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(blocks[int((v - low) / span * (len(blocks) - 1))] for v in values)

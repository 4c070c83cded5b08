"""The files of ``rlaas train --out DIR``: a `RunSink` that writes a run's reports to a folder.

- ``metrics.jsonl``: one object per step, ``{"step": n, <metric>: value, ...}``;
- ``timeline.json``: Chrome trace events of every span (open it in Perfetto). While the
  run goes, the trace's array form, appended to as spans come (the format lets the
  closing bracket be missing, so a killed run's file still opens); on close, rewritten
  in the object form the API's timeline has. Rewriting the whole object at every
  checkpoint, as before, cost the reading game's run a seventh of its time;
- ``trajectories.jsonl``: the sampled `TrajectoryRecord`s, one per line;
- ``checkpoints.jsonl``: one `CheckpointRecord` per checkpoint written (the
  checkpoints themselves go to ``DIR/checkpoints/`` when DIR is the run's artifacts_dir,
  and their exports, a Hugging Face model and a LoRA run's PEFT adapter, to
  ``DIR/exports/``: docs/exports.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.host.telemetry import chrome_trace, trace_event, track_event
from rl_core.records import CheckpointRecord, Span, TrajectoryRecord

MAX_TIMELINE_SPANS = 1_000_000  # past this the oldest are left out of timeline.json


class RunFiles:
    def __init__(self, directory: Path, *, append: bool = False) -> None:
        """``append``: a resumed run adds to the files of the attempt before it."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._spans: list[Span] = []
        self._tids: dict[str, int] = {}  # track -> its row in the appended trace
        self._appended = 0  # events in the appended trace
        if append and (self.directory / "timeline.json").is_file():
            self._spans = read_timeline(self.directory / "timeline.json")
        for name in ("metrics.jsonl", "trajectories.jsonl", "checkpoints.jsonl"):
            path = self.directory / name
            if not append or not path.exists():
                path.write_text("", encoding="utf-8")
        self._restart_trace()

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        # JSON has no NaN/inf: a non-finite value is written as null.
        row = {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}
        self._append("metrics.jsonl", {"step": step, **row})

    def on_spans(self, spans: Sequence[Span]) -> None:
        self._spans.extend(spans)
        if len(self._spans) > MAX_TIMELINE_SPANS:
            del self._spans[: len(self._spans) - MAX_TIMELINE_SPANS]
        if self._appended + len(spans) > 2 * MAX_TIMELINE_SPANS:
            self._restart_trace()  # the file holds the kept spans again
        else:
            self._append_trace(spans)

    def on_trajectories(self, records: Sequence[TrajectoryRecord]) -> None:
        with (self.directory / "trajectories.jsonl").open("a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record.to_json()) + "\n")

    def on_checkpoint(self, record: CheckpointRecord) -> None:
        self._append("checkpoints.jsonl", record.to_json())

    def write_timeline(self) -> None:
        """The whole trace in the object form (what the API's timeline returns)."""
        path = self.directory / "timeline.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(chrome_trace(self._spans)), encoding="utf-8")
        tmp.replace(path)

    def close(self) -> None:
        self.write_timeline()

    def _restart_trace(self) -> None:
        """Start the appended trace afresh, holding the spans kept so far."""
        self._tids, self._appended = {}, 0
        path = self.directory / "timeline.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text("[\n", encoding="utf-8")
        tmp.replace(path)
        self._append_trace(self._spans)

    def _append_trace(self, spans: Sequence[Span]) -> None:
        lines = []
        for span in spans:
            if span.track not in self._tids:
                self._tids[span.track] = len(self._tids) + 1
                lines.append(json.dumps(track_event(span.track, self._tids[span.track])))
            lines.append(json.dumps(trace_event(span, self._tids[span.track])))
        if lines:
            with (self.directory / "timeline.json").open("a", encoding="utf-8") as f:
                f.write(",\n".join(lines) + ",\n")
        self._appended += len(lines)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with (self.directory / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def read_timeline(path: Path) -> list[Span]:
    """The spans of a timeline.json in either form: the object a finished run leaves, or
    the array a killed one does (its closing bracket missing, a comma after its last)."""
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("["):
        text = text.removesuffix("]").rstrip().removesuffix(",") + "]"
    data = json.loads(text)
    events = data if isinstance(data, list) else data.get("traceEvents", [])
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    spans = []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = dict(e.get("args") or {})
        step = int(args.pop("step", 0))
        spans.append(
            Span(
                name=e["name"],
                start_us=int(e["ts"]),
                dur_us=int(e["dur"]),
                track=tracks.get(e["tid"], str(e["tid"])),
                step=step,
                args=args or None,
            )
        )
    return spans


__all__ = ["RunFiles"]

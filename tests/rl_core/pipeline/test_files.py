"""``rlaas train --out DIR``'s timeline.json: appended while the run goes, whole at the end.

Rewriting the whole trace at every checkpoint made a run's file writes grow with the
square of its length (a seventh of the reading game's time); now each span is written
once, and the file opens at every moment, a killed run's included.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_core.pipeline.files import RunFiles, read_timeline
from rl_core.records import CheckpointRecord, Span


def _spans(step: int) -> list[Span]:
    return [
        Span(name="train_step", start_us=step * 1000, dur_us=500, track="trainer", step=step),
        Span(name="generate", start_us=step * 1000 + 10, dur_us=90, track="engine", step=step),
    ]


def _array(path: Path) -> list[dict[str, object]]:
    """The file as a viewer of a killed run's trace reads it: an array, ``]`` optional."""
    text = path.read_text()
    assert text.startswith("[\n") and text.endswith(",\n")
    events: list[dict[str, object]] = json.loads(text.rstrip().removesuffix(",") + "]")
    return events


def test_spans_are_appended_as_they_come_and_the_end_writes_the_object_form(
    tmp_path: Path,
) -> None:
    files = RunFiles(tmp_path)
    files.on_spans(_spans(1))
    first = (tmp_path / "timeline.json").read_text()
    files.on_spans(_spans(2))
    files.on_checkpoint(CheckpointRecord(step=2, uri="ckpt"))
    text = (tmp_path / "timeline.json").read_text()
    assert text.startswith(first)  # appended, not rewritten
    events = _array(tmp_path / "timeline.json")
    names = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M"}  # type: ignore[index]
    assert set(names) == {"trainer", "engine"}
    assert [e["ts"] for e in events if e["ph"] == "X"] == [1000, 1010, 2000, 2010]

    files.close()
    whole = json.loads((tmp_path / "timeline.json").read_text())
    assert [e["ts"] for e in whole["traceEvents"] if e["ph"] == "X"] == [1000, 1010, 2000, 2010]


def test_a_killed_runs_trace_is_read_back_and_continued_by_the_next_attempt(
    tmp_path: Path,
) -> None:
    files = RunFiles(tmp_path)
    files.on_spans(_spans(1) + _spans(2))
    del files  # killed: never closed, the file is the array without its bracket
    assert len(read_timeline(tmp_path / "timeline.json")) == 4

    resumed = RunFiles(tmp_path, append=True)
    resumed.on_spans(_spans(3))
    events = _array(tmp_path / "timeline.json")
    assert [e["ts"] for e in events if e["ph"] == "X"] == [1000, 1010, 2000, 2010, 3000, 3010]
    resumed.close()
    again = RunFiles(tmp_path, append=True)  # a closed run's object form reads back too
    assert [s.start_us for s in again._spans] == [1000, 1010, 2000, 2010, 3000, 3010]

"""A real ``sessions`` run for the framework tests: `rlaas train`'s path in a thread.

The run is the tiny model (random weights) on the JAX engine, served by the CLI's
gateway (`train_to_folder`, as `tests/worker/test_sessions_run.py` drives it); the
framework plays its episodes from client threads beside it, pointed only at the run's
session URL, until the run ends. A random-init model writes a valid tool call only
because the call is constrained: the frameworks send strict tools (and, where the test
says so, a forcing ``tool_choice``), which the session serves by grammar.

`run_sessions` returns what the run wrote (its metrics and trajectories) and what the
clients saw; the tests check that the run trained and that the trajectories hold,
as trained tokens, the tool calls the framework received.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl_core.agent.toolcalls import scan_tool_calls
from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.sessions import SessionGateway

GROUP = 2
log = logging.getLogger(__name__)

SPEC: dict[str, Any] = {
    "name": "frameworks",
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "sessions"},
    # Tools are described in the system message: the prompt is several hundred tokens.
    "agent": {"max_new_tokens": 128, "max_context": 1024},
    "rollout": {"group_size": GROUP, "concurrency": 4, "episode_timeout_s": 120},
    "algorithm": {"batch_groups": 1},
    "staleness": {"mode": "async", "max_staleness": 1},
    "train": {"steps": 2, "seed": 0},
}


@dataclasses.dataclass
class RunOutcome:
    steps_completed: int
    metrics: list[dict[str, Any]]
    trajectories: list[dict[str, Any]]
    played: list[Any]  # what each episode function returned
    errors: list[BaseException]

    def played_back(self) -> list[dict[str, Any]]:
        """The trajectories of sessions the clients ended with a reward."""
        return [t for t in self.trajectories if t["end_state"] == "done"]


Episode = Callable[[SessionGateway, int, int], Any]  # (gateway, task, member) -> result


def run_sessions(tmp: Path, episode: Episode, *, spec: dict[str, Any] | None = None) -> RunOutcome:
    """Train a sessions run while ``episode`` plays its groups (``GROUP`` episodes of a
    task at once, in threads), until the run ends."""
    out = tmp / "run"
    done = threading.Event()
    played: list[Any] = []
    errors: list[BaseException] = []

    def clients() -> None:
        gateway = SessionGateway.from_folder(out, wait_s=600)
        with ThreadPoolExecutor(max_workers=GROUP) as pool:
            task = 0
            while not done.is_set():
                futures = [pool.submit(episode, gateway, task, m) for m in range(GROUP)]
                for future in futures:
                    try:
                        played.append(future.result())
                    except Exception as exc:
                        # Near the end the run stops serving under open sessions.
                        if not done.is_set() and (out / "sessions.json").exists():
                            errors.append(exc)
                            log.warning("an episode failed: %r", exc)
                task += 1

    thread = threading.Thread(target=clients)
    thread.start()
    try:
        result = train_to_folder(
            parse_spec(spec or SPEC), out, gateway=_session_gateway(out, "127.0.0.1", 0)
        )
    except Exception as exc:
        raise AssertionError(f"the run failed; the clients' errors: {errors}") from exc
    finally:
        done.set()
        thread.join(120)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trajectories = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    return RunOutcome(result.steps_completed, metrics, trajectories, played, errors)


def trained_text(record: dict[str, Any]) -> str:
    """The text of a stored trajectory's trained (sampled) segments, in order."""
    return "".join(s["text"] for s in record["segments"] if s["trained"])


def assert_trained_on_tool_calls(
    outcome: RunOutcome,
    calls: list[tuple[str, Any]],
    *,
    parsed: bool = False,
) -> None:
    """The run trained its steps on played sessions, and the tool calls in the stored
    trajectories' trained text (as the session reads them: Hermes blocks) are calls a
    framework received, name and arguments byte for byte: what the model sampled is
    what the client got and what the trainer was given. ``parsed``: the framework keeps
    the arguments only as parsed JSON (LangChain), compared as such."""
    assert not outcome.errors, outcome.errors[0]
    assert outcome.steps_completed == SPEC["train"]["steps"]
    assert [r["step"] for r in outcome.metrics] == [1, 2]
    assert all(r["episode/trained"] >= 1 for r in outcome.metrics)
    played_back = outcome.played_back()
    assert played_back and all(r["info"]["prefix_breaks"] == 0 for r in played_back)
    stored = [
        (block.name, block.arguments_text)
        for record in played_back
        for block in scan_tool_calls(trained_text(record))
        if block.name is not None and block.arguments_text is not None
    ]
    # The run stores a sample of its trajectories: each call stored was received.
    assert stored, [trained_text(r) for r in played_back]
    if parsed:
        stored = [(name, json.loads(arguments)) for name, arguments in stored]
    assert all(call in calls for call in stored), (stored, calls)

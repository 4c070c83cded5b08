"""Client faults never fail a sessions run: `rlaas train`'s path with clients that fail.

The run is `train_to_folder` with the CLI's gateway (the tiny model's trainer, a scripted
engine: `ToolCallingPolicy`), in a thread beside client threads written against
`sdk.sessions` and the official ``openai`` package. One client cancels every other
session it opens: the slots are offered again, every group fills, the run succeeds, and
its stored trajectories are the trained ones per ``trajectories_per_step`` plus readable
cancelled sessions, none of them empty or marked trained. Clients that cancel every
session fail the run, with the client-fault budget's reason.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rl_core.errors import ClientFaults
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline import build
from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.sessions import SessionGateway
from tests.worker.test_sessions_run import SPEC, ToolCallingPolicy, run_ended

GROUP, GROUPS, STEPS, PER_STEP = 2, 2, 2, 8
FAULTY_SPEC = {
    **SPEC,
    "agent": {"max_new_tokens": 64, "max_context": 512},
    "rollout": {"group_size": GROUP, "concurrency": 4},
    "algorithm": {"batch_groups": GROUPS},
    "train": {"steps": STEPS, "seed": 0, "trajectories_per_step": PER_STEP},
}


def play(gateway: SessionGateway, cancel: bool) -> str:
    """One unnamed session: a model call, then a reward, or a cancel (the agent failed)."""
    with gateway.open(wait_s=20) as session:
        client = session.openai(max_retries=0)
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 3 + 4?"}]
        )
        if cancel:
            session.cancel()
            return "cancelled"
        session.end(1.0)
        return "done"


def run_with_clients(
    spec: dict[str, Any], out: Path, cancel: Callable[[int], bool]
) -> tuple[Any, list[str], list[BaseException]]:
    """Train ``spec`` while 4 client threads play sessions (the n-th cancelled when
    ``cancel(n)``) until it ends; returns its result, what they played, their errors."""
    done = threading.Event()
    played: list[str] = []
    errors: list[BaseException] = []

    def clients() -> None:
        gateway = SessionGateway.from_folder(out, wait_s=300)
        count = itertools.count()
        with ThreadPoolExecutor(max_workers=4) as pool:
            while not done.is_set():
                futures = [pool.submit(play, gateway, cancel(next(count))) for _ in range(4)]
                for future in futures:
                    try:
                        played.append(future.result())
                    except Exception as exc:
                        # The run ending under a session (410, then no gateway) is no
                        # client error.
                        serving = not done.is_set() and (out / "sessions.json").exists()
                        if serving and not run_ended(exc):
                            errors.append(exc)

    thread = threading.Thread(target=clients)
    thread.start()
    try:
        result = train_to_folder(
            parse_spec(spec), out, gateway=_session_gateway(out, "127.0.0.1", 0)
        )
        return result, played, errors
    finally:
        done.set()
        thread.join(60)


@pytest.mark.timeout(300)
def test_a_run_whose_client_cancels_half_its_sessions_still_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = ToolCallingPolicy(BuiltinTokenizer())
    monkeypatch.setattr(build, "build_engine", lambda *args, **kwargs: policy)
    out = tmp_path / "run"
    result, played, errors = run_with_clients(FAULTY_SPEC, out, cancel=lambda n: n % 2 == 1)
    assert not errors, errors[0]  # never a refusal (a 409) for another session's cancel
    assert result.steps_completed == STEPS
    assert played.count("cancelled") >= 2

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # Every group filled: its cancelled members' slots were played again.
    assert all(r["episode/trained"] == GROUPS * GROUP for r in rows)
    assert sum(r["sessions/reoffered"] for r in rows) >= 1
    assert sum(r["sessions/client_faults"] for r in rows) >= 1
    assert sum(r.get("failures/client_cancelled", 0) for r in rows) >= 1

    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert records and all(r["segments"] for r in records)  # no row for a slot never played
    for step in range(1, STEPS + 1):
        trained = [r for r in records if r["step"] == step]
        # Every trained episode (fewer than trajectories_per_step), model text trained.
        assert len(trained) == min(PER_STEP, GROUPS * GROUP)
        assert all(r["end_state"] == "done" for r in trained)
        assert all(any(s["trained"] for s in r["segments"]) for r in trained)
    cancelled = [r for r in records if r["end_state"] == "cancelled"]
    assert cancelled and all(r["step"] == 0 for r in cancelled)
    assert any(r["end_reason"] == "client_cancelled" and r["turns"] == 1 for r in cancelled)
    assert not any(s["trained"] for r in cancelled for s in r["segments"])


@pytest.mark.timeout(300)
def test_clients_that_fail_every_session_fail_the_run_on_the_client_fault_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = ToolCallingPolicy(BuiltinTokenizer())
    monkeypatch.setattr(build, "build_engine", lambda *args, **kwargs: policy)
    spec = {**FAULTY_SPEC, "rollout": {**FAULTY_SPEC["rollout"], "client_fault_budget": 6}}
    with pytest.raises(ClientFaults) as failed:
        run_with_clients(spec, tmp_path / "run", cancel=lambda n: True)
    message = str(failed.value)
    assert message.startswith("6 sessions in a row ended without a reward (6 cancelled")
    assert "rollout.client_fault_budget (now 6)" in message
    # The cancelled sessions are in the run's trajectories to read, never trained.
    records = [
        json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert sum(r["end_reason"] == "client_cancelled" for r in records) >= 4
    assert all(r["end_state"] == "cancelled" for r in records)  # the rest: the run's end
    assert not any(s["trained"] for r in records for s in r["segments"])

"""A whole ``sessions`` run: the tiny model trained on episodes a client's own agent plays.

`rlaas train`'s path (`train_to_folder` with the CLI's gateway) runs in a thread; the
client is an ordinary agent loop written against the ``openai`` package, playing
next_number (say the number after the one shown) over three turns, several sessions at
once, GRPO groups by task name, ending each with the reward it judged. What is checked:
the run trains its steps on those episodes, token-exact, with the staleness bound, and
reports its sessions in the metrics and trajectories.
"""

from __future__ import annotations

import json
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.errors import RlaasError
from sdk.sessions import SessionGateway

GROUP = 4
SPEC = {
    "name": "sessions-run",
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "sessions"},
    "agent": {"max_new_tokens": 8, "max_context": 96},
    "rollout": {"group_size": GROUP, "concurrency": 8},
    "algorithm": {"batch_groups": 2},
    "staleness": {"mode": "async", "max_staleness": 1},
    "train": {"steps": 3, "seed": 0},
}


def play(gateway: SessionGateway, task: int) -> float:
    """One episode of the client's own game, through the run's policy."""
    numbers = random.Random(task).choices(range(1, 9), k=3)
    with gateway.open(group=f"task-{task}", wait_s=30) as session:
        client = session.openai(max_retries=0)
        messages = [{"role": "system", "content": "Answer each number with the number after it."}]
        rewards = []
        for n in numbers:
            messages.append({"role": "user", "content": str(n)})
            answer = client.chat.completions.create(model="policy", messages=messages)
            text = answer.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            found = re.search(r"\d+", text)
            rewards.append(1 / 3 if found and int(found.group()) == n + 1 else 0.0)
        session.end(sum(rewards), turn_rewards=rewards)
    return sum(rewards)


@pytest.mark.timeout(600)
def test_a_sessions_run_trains_on_episodes_an_openai_agent_plays(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    out = tmp_path / "run"
    done = threading.Event()
    played: list[float] = []
    errors: list[BaseException] = []

    def clients() -> None:
        # Client threads beside the run (the run itself needs the main thread: Ctrl-C).
        gateway = SessionGateway.from_folder(out, wait_s=300)
        assert (out / "sessions.json").stat().st_mode & 0o077 == 0  # the token is the owner's
        with ThreadPoolExecutor(max_workers=8) as pool:
            task = 0
            while not done.is_set():
                batch = [pool.submit(play, gateway, task + k // GROUP) for k in range(2 * GROUP)]
                task += 2
                for future in batch:
                    try:
                        played.append(future.result())
                    except RlaasError:
                        pass  # no free episode in time, or the run ended while it waited
                    except Exception as exc:
                        if (out / "sessions.json").exists():  # the run still serves
                            errors.append(exc)

    client_thread = threading.Thread(target=clients)
    client_thread.start()
    try:
        result = train_to_folder(spec, out, gateway=_session_gateway(out, "127.0.0.1", 0))
    finally:
        done.set()
        client_thread.join(60)
    assert not errors, errors[0]
    assert result.steps_completed == 3
    assert not (out / "sessions.json").exists()  # written owner-only, gone with the gateway

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["episode/trained"] >= GROUP for r in rows)
    assert sum(r["sessions/opened"] for r in rows) <= len(played) + 8  # some may be open at the end
    assert sum(r["sessions/prefix_breaks"] for r in rows) == 0
    assert max(r["staleness/max"] for r in rows) <= 1
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    played_back = [r for r in records if r["end_state"] == "done"]
    # The rest: episodes still waiting for a client when the run ended.
    assert all(r["end_state"] == "cancelled" for r in records if r not in played_back)
    assert played_back
    for record in played_back:
        # The client's conversation, with only the model's answers trained on.
        texts = [s["text"] for s in record["segments"]]
        assert "Answer each number" in texts[0] and not record["segments"][0]["trained"]
        assert [s["trained"] for s in record["segments"]][1::2] == [True] * 3
        assert record["turns"] == 3 and record["info"]["prefix_breaks"] == 0

"""A whole ``sessions`` run: the tiny model trained on episodes a client's own agent plays.

`rlaas train`'s path (`train_to_folder` with the CLI's gateway) runs in a thread; the
client is an ordinary agent loop written against the ``openai`` package, playing
next_number (say the number after the one shown) over three turns, several sessions at
once, GRPO groups by task name, ending each with the reward it judged. What is checked:
the run trains its steps on those episodes, token-exact, with the staleness bound, and
reports its sessions in the metrics and trajectories.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rl_core.agent.ledger import Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline import build
from rl_core.pipeline.runner import train_to_folder
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.errors import RlaasError
from sdk.sessions import SessionGateway
from tests.worker.test_gateway import ARGUMENTS, CALLING, TOOLS

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


def run_ended(exc: BaseException) -> bool:
    """The run's answer once it has ended (410), before its gateway closes."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return getattr(exc, "status_code", status) == 410 or "answered 410" in str(exc)


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
                        if (out / "sessions.json").exists() and not run_ended(exc):
                            errors.append(exc)  # the run still serves

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


# --- a tool-using agent: what the trainer gets is what the engine served ---------------


class ToolCallingPolicy:
    """A scripted engine (`RolloutEngine`): a tool call when the conversation's last word
    is the user's, an answer once a tool has spoken. A random-init model never writes a
    tool call, so the policy here is chosen tokens; what is under test is everything
    around it: the gateway, the record, the staleness gate and the trainer's batch. Every
    call is logged as (prompt, completion, logprobs)."""

    def __init__(self, tok: BuiltinTokenizer) -> None:
        self.tok, self.version = tok, 0
        self.replies = {
            "call": [*tok.encode(CALLING), tok.end_of_turn_id],
            "answer": [*tok.encode("7"), tok.end_of_turn_id],
        }
        self.calls: list[tuple[list[int], list[int], list[float]]] = []

    @property
    def policy_version(self) -> int:
        return self.version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
    ) -> list[Completion]:
        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt, skip_special=False)
            tool_spoke = text.rfind("<|tool|>") > text.rfind("<|user|>")
            tokens = self.replies["answer" if tool_spoke else "call"]
            logprobs = [-0.01 * (len(self.calls) + 1 + i / 1000) for i in range(len(tokens))]
            self.calls.append((list(prompt), tokens, logprobs))
            out.append(
                Completion(
                    tokens=tokens,
                    logprobs=logprobs,
                    finish_reason="stop",
                    policy_version=self.version,
                )
            )
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.version = version


def tool_agent(base: str, token: str, game: int, kind: str) -> dict[str, Any]:
    """One episode of an ordinary tool-using agent on the official ``openai`` client.
    ``kind``: ``plain``; ``edits`` (rewrites its first message before the second call:
    a prefix break); ``abandons`` (never ends the session: it must time out)."""
    opened = httpx.post(
        f"{base}/v1/sessions",
        json={"group": f"game-{game}", "wait_s": 45},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    opened.raise_for_status()
    session = opened.json()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
    question = {"role": "user", "content": "What is 3 + 4?"}
    first = client.chat.completions.create(
        model="policy", messages=[question], tools=TOOLS, logprobs=True
    )
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("add", ARGUMENTS)
    args = json.loads(call.function.arguments)
    messages: list[Any] = [question, message.model_dump(exclude_none=True)]
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
    )
    if kind == "edits":
        messages[0] = {"role": "user", "content": "What is 3 + 4? Be brief."}
    if kind == "abandons":
        return {"id": session["session_id"], "kind": kind}
    chunks = client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, stream=True
    )
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert answer == "7"
    ended = httpx.post(
        f"{session['base_url']}/end",
        json={"reward": 1.0, "turn_rewards": [0.0, 1.0]},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    ended.raise_for_status()
    return {
        "id": session["session_id"],
        "kind": kind,
        "logprobs": [t.logprob for t in first.choices[0].logprobs.content],
        "end": ended.json(),
    }


# The abandoned session must time out; no other may. At 3 s a plain session of a loaded CI
# machine timed out too (its `end` then answered 404), so the bound leaves them room.
TIMEOUT_S = 10.0


@pytest.mark.timeout(600)
def test_a_tool_using_agents_calls_are_trained_on_exactly_as_the_engine_sampled_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = ToolCallingPolicy(BuiltinTokenizer())
    monkeypatch.setattr(build, "build_engine", lambda *args, **kwargs: policy)
    trained: list[Trajectory] = []
    real_batch = build.build_batch

    def spy(groups: list[Any], **options: Any) -> Any:  # what the trainer is given
        trained.extend(t for g in groups for t in g.to_train)
        return real_batch(groups, **options)

    monkeypatch.setattr(build, "build_batch", spy)
    spec = parse_spec(
        {
            **SPEC,
            "agent": {"max_new_tokens": 64, "max_context": 1024},  # tools spelt out: ~540
            "rollout": {"group_size": 2, "concurrency": 4, "episode_timeout_s": TIMEOUT_S},
            "algorithm": {"batch_groups": 2},
            "train": {"steps": 2, "seed": 0},
        }
    )
    out = tmp_path / "run"
    done = threading.Event()
    played: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def clients() -> None:
        served = SessionGateway.from_folder(out, wait_s=300)  # only to read sessions.json
        url, token = served.url, json.loads((out / "sessions.json").read_text())["token"]
        abandoned_by = 0.0
        with ThreadPoolExecutor(max_workers=2) as pool:
            for game in itertools.count():
                if done.is_set():
                    return
                if game == 2:
                    # No later game before the abandoned session has timed out: the run
                    # needs later games' episodes, so it cannot end (and cancel the
                    # session) first, however fast the steps run.
                    time.sleep(max(0.0, abandoned_by + 0.5 - time.monotonic()))
                kinds = {0: ("plain", "edits"), 1: ("plain", "abandons")}.get(game, ("plain",) * 2)
                futures = [pool.submit(tool_agent, url, token, game, k) for k in kinds]
                for future in futures:
                    try:
                        played.append(future.result())
                    except Exception as exc:
                        serving = not done.is_set() and (out / "sessions.json").exists()
                        if serving and not run_ended(exc):
                            errors.append(exc)
                if game == 1:
                    # The abandoned session opened before now; it times out TIMEOUT_S after.
                    abandoned_by = time.monotonic() + TIMEOUT_S

    client_thread = threading.Thread(target=clients)
    client_thread.start()
    try:
        result = train_to_folder(spec, out, gateway=_session_gateway(out, "127.0.0.1", 0))
    except Exception as exc:
        raise AssertionError(f"the run failed; the clients' errors: {errors}") from exc
    finally:
        done.set()
        client_thread.join(60)
    assert not errors, errors[0]
    assert result.steps_completed == 2

    by_id = {p["id"]: p for p in played}
    assert trained and all(t.episode_id in by_id for t in trained)
    served = {(tuple(p), tuple(c), tuple(lp)) for p, c, lp in policy.calls}
    for traj in trained:
        kind = by_id[traj.episode_id]["kind"]
        assert kind != "abandons"
        # One sample per unbroken run of calls; in it, each stretch of loss-masked tokens
        # is one call's completion as the engine sampled it (ids and logprobs), after
        # exactly the prompt that call was given; nothing else is in the loss.
        assert len(traj.samples) == (2 if kind == "edits" else 1)
        for sample in traj.samples:
            stretches = 0
            for start, end in _runs(sample.loss_mask):
                call = (
                    tuple(sample.tokens[:start]),
                    tuple(sample.tokens[start:end]),
                    tuple(sample.logprobs[start:end]),
                )
                assert call in served
                stretches += 1
            assert stretches == (1 if kind == "edits" else 2) == traj.turns // len(traj.samples)
        assert traj.info["prefix_breaks"] == (1 if kind == "edits" else 0)
    # The logprobs a client asked for are the sampler's, for the answer's tokens.
    for p in played:
        if "logprobs" in p:
            assert any(lp[:-1] == p["logprobs"] for _, _, lp in policy.calls)

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    edits = [p for p in played if p["kind"] == "edits"]
    assert sum(r["sessions/prefix_breaks"] for r in rows) == len(edits) == 1
    assert edits[0]["end"]["prefix_breaks"] == 1
    records = {
        r["episode_id"]: r
        for r in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())
    }
    (abandoned,) = (p["id"] for p in played if p["kind"] == "abandons")
    assert records[abandoned]["end_state"] == "timeout"
    assert sum(r["episode/timeout"] for r in rows) == 1  # counted, and not trained (above)
    # On the timeline as the built-in agent's episodes are: a row per session, with its
    # calls and the whole session.
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    assert sum(e["name"] == "model_call" for e in spans) >= 2 * len(trained)
    assert sum(e["name"] == "rollout" for e in spans) >= len(trained)


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in ``mask``."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs

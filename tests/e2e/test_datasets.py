"""Your data in, through the API: upload a JSONL, submit a run naming it with the ``math``
verifier, and a real Celery worker fetches the pinned content and trains the tiny model,
with dynamic sampling on, and its rows' two data sources reported apart. A registered
scorer endpoint (the ``webhook`` reward) scores every episode beside ``math``: the claim
hands it to the worker, which posts each episode to it, signed; and a registered LLM
judge (the ``judge`` reward, an OpenAI-compatible fake on loopback) scores each group in
one call, with the key the tenant registered. Held-out pass@1 and pass@2 on its eval
split reach the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_core.protocol.webhook import ScoreRequest
from sdk.client import Client
from sdk.envserver import ScorerServer
from tests.e2e.stack import Stack, wait_until
from tests.rl_core.envs.judge_server import FakeJudge
from tests.sdk.serving import SECRET, serving

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]
STEPS = 2
SOURCES = ("sums/even", "sums odd")  # as metric names: sums_even, sums_odd


def test_a_run_on_an_uploaded_dataset_with_the_math_verifier_trains(
    stack: Stack, tmp_path: Path
) -> None:
    rows = [
        {"question": f"{a}+{b}=", "answer": str(a + b), "data_source": SOURCES[(a + b) % 2]}
        for a in range(10)
        for b in range(10)
    ]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    scored: list[ScoreRequest] = []

    def neutral(request: ScoreRequest) -> float:
        scored.append(request)
        return 0.0  # leaves math's reward as it is: what is proved here is the path

    judge = FakeJudge(scale=0.0)  # neutral too
    # The scorer is on loopback: this deployment allows it (a real one allows public only).
    stack.env["RLAAS_ENV_URL_ALLOWLIST"] = "public,loopback"
    stack.start_api()
    stack.start_worker()
    with (
        Client(stack.api_url, stack.api_key) as sdk,
        serving(ScorerServer(neutral, secret=SECRET).app) as scorer_url,
        serving(judge.app) as judge_url,
    ):
        with stack.client() as client:
            registered = client.post(
                "/v1/environments", json={"name": "scorer", "url": scorer_url, "secret": SECRET}
            )
            assert registered.status_code == 201, registered.text
            judge_key = "sk-judge-0123456789abcdef"
            judge_id = client.post(
                "/v1/environments",
                json={"name": "judge", "url": f"{judge_url}/v1", "secret": judge_key},
            ).json()["id"]
        ds = sdk.upload_dataset(data, required=["question", "answer"])
        assert (ds.rows, ds.fields) == (100, ["answer", "data_source", "question"])
        spec = {
            "model": {"source": "builtin:tiny"},
            "environment": {
                "name": "dataset",
                "reward": "math+webhook+judge",
                "scorer": registered.json()["id"],
                "judge": {
                    "endpoint": judge_id,
                    "model": "judge-model",
                    "rubric": "The sum is right.",
                    "max_calls": 100,
                    "max_tokens": 100_000,
                },
                "config": {"dataset": ds.id, "prompt": "question", "split": {"eval": 0.1}},
            },
            # The random-init model ends a turn by chance: its stop token is about one in
            # 117 at each position, so about two turns in three end within 128 tokens, and
            # that none of a run's episodes ends is a chance under 1e-4 (8 tokens: 1 in 3).
            "agent": {"max_turns": 1, "max_new_tokens": 128, "max_context": 256},
            "rollout": {"group_size": 4, "concurrency": 16},
            # The random-init model's groups are nearly all unanimous (all 0): one is
            # dropped a step and played again, then the cap lets the rest be trained.
            "algorithm": {
                "batch_groups": 2,
                "dynamic_sampling": {"enabled": True, "max_dropped_groups": 1},
            },
            # Held-out: before step 1 and after the last, 2 eval-split rows sampled twice
            # each (the rollout's own temperature: nothing new to compile).
            "train": {
                "steps": STEPS,
                "seed": 0,
                "eval_interval": STEPS,
                "eval_episodes": 2,
                "eval_k": 2,
                "eval_temperature": 1.0,
            },
        }
        with stack.client() as client:
            created = client.post("/v1/runs", json={"spec": spec})
            assert created.status_code == 201, created.text
            run_id = created.json()["id"]

            def finished() -> dict[str, object] | None:
                run = client.get(f"/v1/runs/{run_id}").json()
                return run if run["status"] in ("succeeded", "failed", "cancelled") else None

            run = wait_until(finished, 240, f"run {run_id} to finish", stack)
            assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
            assert run["current_step"] == STEPS
            pinned = client.get(f"/v1/runs/{run_id}").json()["spec"]["environment"]["config"]
            assert pinned["sha256"] == ds.sha256 and "path" not in pinned
            points = client.get(
                f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"}
            ).json()["points"]
            assert [p["step"] for p in points] == list(range(1, STEPS + 1))
            # Every episode was scored by the verifier: none failed for the checker's fault.
            failures = client.get(
                f"/v1/runs/{run_id}/metrics", params={"name": "failures/total"}
            ).json()["points"]
            assert [p["value"] for p in failures] == [0.0] * STEPS
            # pass@1 and pass@2 of the held-out rows reach the API (and its name filter).
            for name in ("eval/pass@1", "eval/pass@2"):
                held = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
                assert [p["step"] for p in held["points"]] == [0, STEPS], held
                assert all(0.0 <= p["value"] <= 1.0 for p in held["points"])
            every = client.get(f"/v1/runs/{run_id}/metrics").json()["points"]
            by_step: dict[int, dict[str, float]] = {}
            for p in every:
                by_step.setdefault(p["step"], {})[p["name"]] = p["value"]
            for step in (0, STEPS):  # every sample played: 2 tasks x k = 2
                assert by_step[step]["eval/episodes"] + by_step[step]["eval/failed"] == 4
                assert by_step[step]["eval/pass@1"] <= by_step[step]["eval/pass@2"]
            for step in range(1, STEPS + 1):
                m = by_step[step]
                # Dynamic sampling's figures: a unanimous group trained means the cap (1)
                # was reached first; the share is of the groups the step took.
                dropped, trained = m["groups/dropped_equal"], m["groups/trained"]
                assert dropped in (0.0, 1.0) and (m["groups/trained_equal"] == 0 or dropped == 1)
                assert m["groups/dropped_equal_frac"] == dropped / (dropped + trained)
                # Per source: the step's trained episodes, each under its row's source.
                sources = [
                    n.removeprefix("episode/trained/")
                    for n in m
                    if n.startswith("episode/trained/")
                ]
                assert sources and set(sources) <= {"sums_even", "sums_odd"}, sorted(m)
                assert sum(m[f"episode/trained/{s}"] for s in sources) == m["episode/trained"]
                total = sum(m[f"reward/mean/{s}"] * m[f"episode/trained/{s}"] for s in sources)
                assert abs(total - m["reward/mean"] * m["episode/trained"]) < 1e-6
            # Every step's episodes, step by step (step 0 holds the untrained ones cut at
            # the end, which could fill a first page by themselves).
            items = [
                t
                for step in range(STEPS + 1)
                for t in client.get(
                    f"/v1/runs/{run_id}/trajectories", params={"step": step, "limit": 50}
                ).json()["items"]
            ]
            played = [t for t in items if t["end_state"] == "done"]
            assert played, items[:2]
            # Each episode that ended "done" was posted to the scorer, with its row's answer.
            ids = {r.episode_id for r in scored}
            assert {t["episode_id"] for t in played} <= ids, (len(played), len(ids))
            for r in scored:
                a, b = r.prompt[-1].content.removesuffix("=").split("+")
                assert r.answer == str(int(a) + int(b)) and r.info["data_source"] in SOURCES
            # The judge: one call per group (its members that ended, at most 4; a held-out
            # task's 2 samples), with the registered key; every such episode judged.
            assert judge.requests
            for request, headers in zip(judge.requests, judge.headers, strict=True):
                assert headers["authorization"] == f"Bearer {judge_key}"
                assert 1 <= request["messages"][1]["content"].count("# Answer a") <= 4
            assert all("judge" in t["info"]["reward_terms"] for t in played)
        # Now in use by nothing unfinished: the owner may delete it.
        sdk.delete_dataset(ds.id)
        assert sdk.list_datasets() == []

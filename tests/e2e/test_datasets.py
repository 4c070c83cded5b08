"""Your data in, through the API: upload a JSONL, submit a run naming it with the ``math``
verifier, and a real Celery worker fetches the pinned content and trains the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdk.client import Client
from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]
STEPS = 2


def test_a_run_on_an_uploaded_dataset_with_the_math_verifier_trains(
    stack: Stack, tmp_path: Path
) -> None:
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    stack.start_api()
    stack.start_worker()
    with Client(stack.api_url, stack.api_key) as sdk:
        ds = sdk.upload_dataset(data, required=["question", "answer"])
        assert (ds.rows, ds.fields) == (100, ["answer", "question"])
        spec = {
            "model": {"source": "builtin:tiny"},
            "environment": {
                "name": "dataset",
                "reward": "math",
                "config": {"dataset": ds.id, "prompt": "question", "split": {"eval": 0.1}},
            },
            # The random-init model ends a turn by chance: its stop token is about one in
            # 117 at each position, so about two turns in three end within 128 tokens, and
            # that none of a run's episodes ends is a chance under 1e-4 (8 tokens: 1 in 3).
            "agent": {"max_turns": 1, "max_new_tokens": 128, "max_context": 256},
            "rollout": {"group_size": 4, "concurrency": 16},
            "algorithm": {"batch_groups": 2},
            "train": {"steps": STEPS, "seed": 0},
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
        # Now in use by nothing unfinished: the owner may delete it.
        sdk.delete_dataset(ds.id)
        assert sdk.list_datasets() == []

"""One run through the whole product: tenant key → POST /v1/runs → Celery worker → metrics,
and its final checkpoint downloaded as a Hugging Face model."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from rl_core.models.tokenizer import BuiltinTokenizer
from sdk.client import Client
from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_tiny_game_run_succeeds_with_reward_per_step(stack: Stack, tmp_path: Path) -> None:
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["train"]["steps"] = steps = 6  # the path, not learning: each step more is CI time

    with stack.client() as client:
        created = client.post("/v1/runs", json={"spec": spec})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        assert created.json()["status"] == "queued"

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(finished, 300, f"run {run_id} to finish", stack)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["current_step"] == steps

        metrics = client.get(f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"})
        assert metrics.status_code == 200
        points = metrics.json()["points"]
        assert [p["step"] for p in points] == list(range(1, steps + 1))
        assert all(0.0 <= p["value"] <= 1.0 for p in points)

        # The stage timeline, as Chrome trace events: the trainer's steps and the episodes' stages.
        trace = client.get(f"/v1/runs/{run_id}/timeline", params={"limit": 100_000}).json()
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        names = {e["name"] for e in spans}
        assert {"train_step", "weight_sync", "rollout", "model_call", "env_step"} <= names, names
        assert all(e["dur"] >= 0 for e in spans)

        # Sampled trajectories: the text, with the model's own tokens marked as trained.
        page = client.get(f"/v1/runs/{run_id}/trajectories", params={"limit": 50}).json()
        # (Episodes still in flight when the last step is trained end as "cancelled".)
        played = [t for t in page["items"] if t["end_state"] in ("done", "truncated")]
        assert played, f"no played trajectories reached the control plane: {page['items'][:2]}"
        first = played[0]
        assert first["step"] >= 1 and first["total_tokens"] > first["model_tokens"] > 0
        assert any(seg["trained"] for seg in first["segments"])
        assert any(not seg["trained"] for seg in first["segments"])

        # The final checkpoint, downloaded as a Hugging Face model (the worker exported it
        # beside the checkpoint): transformers loads it, and its tokenizer files give the
        # ids the run trained on (tests/rl_core/training/test_exports.py: its logprobs).
        with Client(stack.api_url, stack.api_key) as sdk:
            folder = sdk.download_checkpoint(run_id, format="hf", out=tmp_path / "model")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(folder)
        text = "Guess the number between 1 and 8."
        assert AutoTokenizer.from_pretrained(folder)(text)["input_ids"] == (
            BuiltinTokenizer().encode(text)
        )
        assert model.config.vocab_size == BuiltinTokenizer().vocab_size

        events = client.get(f"/v1/runs/{run_id}/events").json()
        statuses = [e["to_status"] for e in events["items"]]
        assert statuses == ["queued", "starting", "running", "succeeded"]

    # The worker's sandbox wall (bubblewrap: CI installs it), in its start-up line, in the
    # claim's event and on /readyz (this test is a loopback client: an operator's view).
    # The claim's event also names the credential the worker was enrolled with (conftest).
    claimed = events["items"][1]["reason"]
    assert "(sandbox wall: bwrap), with worker credential wcr_" in claimed, claimed
    assert claimed.endswith("(e2e-worker)"), claimed
    assert "sandbox wall: bubblewrap" in (stack.logs / "worker.log").read_text()
    workers = httpx.get(f"{stack.api_url}/readyz", timeout=10).json()["workers"]
    assert [(w["sandbox_wall"], w["tenant_code"]) for w in workers] == [("bwrap", "runs")]

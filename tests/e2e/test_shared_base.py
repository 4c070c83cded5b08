"""A worker that hosts two runs at once (RLAAS_RUNS_PER_WORKER=2, docs/shared-base.md):
two tenants' LoRA runs of one base, submitted through the API, train at the same time in
the one worker process on one copy of the base, and both succeed."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_two_lora_runs_of_one_base_train_at_once_on_one_worker(stack: Stack) -> None:
    stack.env["RLAAS_RUNS_PER_WORKER"] = "2"
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["model"]["lora"] = {"rank": 4}
    spec["train"]["steps"] = 2  # the hosting, not learning
    with stack.client() as client:
        ids = []
        for lr in (0.01, 0.003):
            spec["algorithm"]["learning_rate"] = lr
            r = client.post("/v1/runs", json={"spec": spec})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        def finished() -> list[dict[str, object]] | None:
            runs = [client.get(f"/v1/runs/{i}").json() for i in ids]
            done = all(r["status"] in ("succeeded", "failed", "cancelled") for r in runs)
            return runs if done else None

        runs = wait_until(finished, 300, "both runs to finish", stack)
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"], stack.dump_logs()
    log = (stack.logs / "worker.log").read_text(errors="replace")
    # The second run leased the base the first had loaded: both held it at once.
    assert "shares builtin:tiny, held by 2 run(s)" in log, stack.dump_logs()

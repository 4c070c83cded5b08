"""One API, two accelerators: a run asking for cpu trains on a worker listening on the cpu
queue the operator named (not the default's), and a gpu run waits for a GPU worker
instead of being taken by it (docs/accelerators.md)."""

from __future__ import annotations

import uuid

import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_a_cpu_run_trains_on_the_cpu_queue_and_a_gpu_run_waits(stack: Stack) -> None:
    suffix = uuid.uuid4().hex[:8]
    cpu_queue, gpu_queue = f"rlaas-cpu-{suffix}", f"rlaas-gpu-{suffix}"
    # gpu first: the default, so the cpu run must ask for its accelerator by name.
    stack.env["RLAAS_QUEUES"] = f"gpu={gpu_queue},cpu={cpu_queue}"
    stack.start_api()
    stack.env["RLAAS_QUEUE"] = cpu_queue  # the worker's one queue (with --serve's)
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["train"]["steps"] = 2  # the route, not learning

    with stack.client() as client:
        gpu = client.post("/v1/runs", json={"spec": spec})  # the default: gpu
        assert gpu.status_code == 201 and gpu.json()["accelerator"] == "gpu", gpu.text
        cpu_spec = {**spec, "resources": {"accelerator": "cpu"}}
        cpu = client.post("/v1/runs", json={"spec": cpu_spec})
        assert cpu.status_code == 201 and cpu.json()["accelerator"] == "cpu", cpu.text

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{cpu.json()['id']}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(finished, 300, "the cpu run to finish", stack)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["current_step"] == 2
        # The CPU worker never took the GPU run (its claims stay in its queue's accelerator).
        waiting = client.get(f"/v1/runs/{gpu.json()['id']}").json()
        assert (waiting["status"], waiting["attempts"]) == ("queued", 0), waiting

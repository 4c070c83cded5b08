"""A worker SIGKILLed mid-run on the S3 artifact store, resumed by a worker that has no
access to the first one's disk (another artifacts folder): the run's checkpoints reach the
second worker through the store only (moto's S3 server on loopback), the run succeeds with
each step once in its policy, and the final checkpoint's PEFT adapter downloads over the
API, which reads the store too (its own data folder holds nothing of the run). `peft` and
`transformers` load that adapter onto the base and score as rlaas's trainer does with the
final checkpoint restored from the store."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.stack import Stack, wait_until
from tests.faults.test_worker_kills import kill, poll
from tests.s3_server import CREDENTIALS

# About a minute on quiet cores (two worker start-ups and compiles), more under load.
pytestmark = [pytest.mark.e2e, pytest.mark.minutes(1)]

SPEC: dict[str, Any] = {
    "model": {"source": "builtin:tiny", "lora": {"rank": 4}},
    "environment": {"name": "guess_number", "config": {"low": 1, "high": 3, "max_turns": 2}},
    "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
    "rollout": {"group_size": 8, "concurrency": 32},
    # The entropy bonus and large steps move the adapter whatever the rewards, so the
    # downloaded adapter's check below can tell it from the base.
    "algorithm": {"batch_groups": 4, "learning_rate": 3e-2, "entropy_coef": 1.0},
    "staleness": {"mode": "sync"},
    "train": {"steps": 6, "checkpoint_interval": 2, "keep_checkpoints": 2, "seed": 0},
}


@pytest.mark.timeout(600)
def test_a_killed_workers_run_resumes_on_another_disk_through_the_store(
    private_stack: tuple[Stack, str], s3_store_url: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    stack, _ = private_stack
    endpoint = os.environ["RLAAS_S3_ENDPOINT"]
    stack.env.update(
        {
            **CREDENTIALS,
            "RLAAS_ARTIFACT_STORE": s3_store_url,
            "RLAAS_S3_ENDPOINT": endpoint,
            # A killed worker's run is queued again about 10 s after its last beat (each
            # beat renews the lease for 10 s); ten beats to a lease, so a busy machine's
            # slow beat does not lose a live worker its run.
            "RLAAS_LEASE_SECONDS": "10",
            "RLAAS_HEARTBEAT_SECONDS": "1",
            "RLAAS_QUOTA_REQUESTS_PER_MINUTE": "100000",
        }
    )
    stack.start_api()
    stack.env["RLAAS_ARTIFACTS_PATH"] = str(tmp_path / "host-1")
    stack.start_worker("worker-1")
    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": SPEC}).json()["id"]

        def run() -> dict[str, Any]:
            return dict(client.get(f"/v1/runs/{run_id}").json())

        def checkpointed() -> bool:
            items = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
            now = run()
            assert now["status"] in ("queued", "starting", "running"), now
            return any(c["step"] >= 2 for c in items)

        poll(checkpointed, 300, "a checkpoint of attempt 1", stack)
        kill(stack, "worker-1", started)
        # Another host: an empty artifacts folder; the store is all the two share.
        stack.env["RLAAS_ARTIFACTS_PATH"] = str(tmp_path / "host-2")
        stack.start_worker("worker-2")

        def finished() -> dict[str, Any] | None:
            now = run()
            return now if now["status"] in ("succeeded", "failed", "cancelled") else None

        final = wait_until(finished, 300, f"run {run_id} to finish", stack)
        print(f"{time.monotonic() - started:6.1f}s: the run {final['status']}")
        assert final["status"] == "succeeded", f"{final}\n{stack.dump_logs()}"
        assert final["attempts"] == 2

        log = (stack.logs / "worker-2.log").read_text(errors="replace")
        assert "downloaded from the store" in log, stack.dump_logs()
        lineage = client.get(f"/v1/runs/{run_id}/lineage").json()
        assert lineage["problems"] == [], lineage
        steps = lineage["steps"]
        assert [s["step"] for s in steps] == list(range(1, 7))
        resumed = [s for s in steps if s["attempt"] == 2]
        assert resumed and resumed[0]["base_attempt"] == 1, steps  # from attempt 1's checkpoint
        items = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
        assert all(c["uri"].startswith(s3_store_url) for c in items), items

        r = client.get(f"/v1/runs/{run_id}/checkpoints/6/export", params={"format": "peft"})
        assert r.status_code == 200, r.text
        assert f"{run_id}-step-6-peft/adapter_model.safetensors".encode() in r.content
        assert not (Path(stack.env["RLAAS_DATA_DIR"]) / "artifacts" / run_id).exists()
        adapter = untar(r.content, tmp_path / "download") / f"{run_id}-step-6-peft"
        final_uri = next(c["uri"] for c in items if c["step"] == 6)
    assert_peft_scores_as_the_checkpoint(adapter, final_uri, s3_store_url, tmp_path)


def untar(data: bytes, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def assert_peft_scores_as_the_checkpoint(
    adapter: Path, checkpoint_uri: str, store_url: str, tmp_path: Path
) -> None:
    """The downloaded adapter on the base (``peft`` + ``transformers``, float32) gives the
    logprobs rlaas's trainer gives with the checkpoint restored from the store, to 1e-4."""
    from peft import PeftModel

    from rl_core.pipeline.build import build_trainer
    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_model
    from rl_core.spec import parse_spec
    from rl_core.store import open_store
    from rl_core.store.folders import download_folder
    from rl_core.training.checkpointing import MARKER
    from tests.rl_core.training.test_exports import load_hf, prompts, torch_logprobs

    store = open_store(store_url, endpoint=os.environ["RLAAS_S3_ENDPOINT"])
    key = checkpoint_uri.removeprefix(store.url.rstrip("/") + "/")
    download_folder(store, key, tmp_path / "checkpoint", marker=MARKER)
    spec = parse_spec(SPEC)
    base, tokenizer = load_model(spec.model, seed=spec.train.seed)
    export_hf(base, tmp_path / "base")  # the base as transformers reads it
    trainer, step, _ = build_trainer(spec, base, str(tmp_path / "checkpoint"))
    assert step == 6
    tokens = prompts(tokenizer)  # type: ignore[arg-type]
    want = trainer.logprobs(tokens)
    adapted = PeftModel.from_pretrained(load_hf(tmp_path / "base"), adapter).eval()
    np.testing.assert_allclose(torch_logprobs(adapted, tokens), want, atol=1e-4)
    # The six steps moved the policy off the base by more than the tolerance, so an
    # adapter that was lost or ignored on the way would fail the check above.
    moved = float(np.max(np.abs(torch_logprobs(load_hf(tmp_path / "base"), tokens) - want)))
    print(f"the trained policy is {moved:.2e} off the base")
    assert moved > 1e-3

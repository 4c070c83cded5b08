"""A stranger's program: the Tinker cookbook's RL loop (``tinker_cookbook.rl.train.main``,
tinker-cookbook 0.6.1, installed by scripts/bootstrap.sh) runs unchanged against rlaas.

The program is tests/app/cookbook_rl_loop.py, in a subprocess, against a real control
plane and model worker (the harness of tests/app/test_tinker.py) on ``builtin:tiny``,
with the ``ppo`` loss and a ``loss_fn_config``. Every step's row is in the cookbook's
metrics.jsonl with what it computes from rlaas's answers: a gradient, the sampler/trainer
KL from forward_backward's logprobs, the KL against the base and the post-update KL from
prompt logprobs (``score_sequences``).

The loop's last act is main()'s final checkpoint: ``save_state`` (the model's state
through the artifact store, docs/tinker.md "Saved state") and ``save_weights_for_sampler``;
the program must exit cleanly, with both paths in the cookbook's checkpoints.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.store import open_store
from tests.app.cookbook_rl_loop import STEPS
from tests.app.test_tinker import tinker_worker
from tests.web.live import live_api, migrated_database

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]

REPO = Path(__file__).resolve().parents[2]


def test_the_cookbook_rl_loop_trains_against_rlaas(postgres_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    artifacts = tmp_path / "artifacts"  # the API's and the worker's store, as on one machine
    api_ctx = live_api(migrated_database(postgres_url), artifacts_path=artifacts)
    with api_ctx as api, tinker_worker(api.url, open_store(f"file://{artifacts}")):
        env = {**os.environ, "TINKER_API_KEY": f"tml-{api.tenant()}"}
        config = json.dumps({"clip_low_threshold": 0.7, "clip_high_threshold": 1.3})
        program = [sys.executable, "-m", "tests.app.cookbook_rl_loop"]
        done = subprocess.run(
            [*program, api.url, str(log_path), "ppo", config],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    assert done.returncode == 0, done.stderr[-6000:]
    saved = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    final = saved[-1]
    assert final["state_path"].startswith("tinker://"), final
    assert "/weights/" in final["state_path"], final
    assert "/sampler_weights/" in final["sampler_path"], final

    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "optim/lr" in r]
    assert [r["progress/batch"] for r in steps] == list(range(STEPS)), rows
    for row in steps:
        assert row["grad_norm"] > 0  # groups had mixed rewards: advantages, then a gradient
        assert row["env/all/by_group/frac_mixed"] > 0
        # From forward_backward's logprobs: the sampler and the trainer agree.
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-3
        # From prompt logprobs (compute_logprobs-style scoring of whole sequences).
        for key in ("kl_policy_base", "kl_pre_post_v1", "kl_pre_post_v2"):
            assert key in row and row[key] == row[key], (key, row)  # present, not NaN
    assert steps[0]["kl_policy_base"] == pytest.approx(0.0, abs=1e-5)  # B = 0: the base
    assert any(r["kl_pre_post_v2"] > 0 for r in steps)  # each update moved the policy

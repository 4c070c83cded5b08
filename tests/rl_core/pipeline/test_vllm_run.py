"""`runner.train` with ``rollout.engine: vllm``: rlaas starts a vLLM CPU server for the run,
rolls out through it and pushes the trainer's weights to it after every step.

The model is ``builtin:small`` (head_dim 32; vLLM's CPU attention refuses the tiny preset's
16). Sync mode: every rollout of step k is sampled by the policy the trainer holds
before step k, so the trainer's recomputed logprobs must equal the server's. A server
that kept serving old weights (docs/vllm.md: the tied LM head that a reload skipped)
shows up as ``mismatch_kl`` far from 0 from step 2 on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_core.errors import RolloutError
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import train
from rl_core.spec import parse_spec
from tests.rl_core.rollout.vllm_venv import ensure_vllm_venv


@pytest.mark.minutes(2)
def test_a_run_with_engine_vllm_trains_through_a_server_it_starts(tmp_path: Path) -> None:
    ensure_vllm_venv()
    spec = parse_spec(
        {
            "model": {"source": "builtin:small"},
            "environment": {
                "name": "guess_number",
                "config": {"low": 1, "high": 4, "max_turns": 2},
            },
            "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
            "rollout": {"engine": "vllm", "group_size": 4, "concurrency": 8},
            # A random policy earns no reward here; the entropy bonus moves the weights
            # anyway, by large steps, so that a server left on old weights would disagree.
            # A negligible KL term makes `kl` report how far the policy has moved.
            "algorithm": {
                "batch_groups": 2,
                "learning_rate": 3e-2,
                "entropy_coef": 1.0,
                "kl_coef": 1e-9,
            },
            "staleness": {"mode": "sync"},
            "train": {"steps": 3, "seed": 0},
        }
    )
    sink = MemorySink()
    result = train(spec, sink=sink, artifacts_dir=tmp_path / "run")
    assert result.steps_completed == 3
    log = (tmp_path / "run" / "vllm-server.log").read_text()
    assert "Reloading weights inplace" in log
    for step, metrics in sink.steps:
        print(
            f"step {step}: mismatch_kl {metrics['mismatch_kl']:.1e} (server vs trainer), "
            f"kl {metrics['kl']:.3f} (policy vs the initial one), "
            f"weight_sync {metrics['time/weight_sync_s']:.2f} s, of which the server paused "
            f"{metrics['vllm/pause_s']:.2f} s; probe check max |Δ logprob| "
            f"{metrics['vllm/check_max_dlogprob']:.1e}"
        )
        assert metrics["mismatch_kl"] == pytest.approx(0.0, abs=1e-4), step
        # The engine's own check of the weights it pushed after this step.
        assert metrics["vllm/check_max_dlogprob"] < 1e-3
        assert metrics["time/engine_paused_s"] > 0
    # The policy moved far more than the mismatch: a server on the step before's (or the
    # initial) weights would have shown a mismatch of this size.
    assert sink.steps[-1][1]["kl"] > 100 * 1e-4
    # Each step's episodes were sampled by the policy of the step before (version = step).
    versions = {(t.step, t.policy_version) for t in sink.trajectories if t.step}
    assert versions == {(1, 0), (2, 1), (3, 2)}


def test_a_vllm_url_where_no_server_answers_fails_the_run_naming_it() -> None:
    spec = parse_spec(
        {
            "environment": {"name": "guess_number"},
            "rollout": {"engine": "vllm", "vllm_url": "http://127.0.0.1:9"},
            "train": {"steps": 1},
        }
    )
    with pytest.raises(RolloutError, match=r"no vLLM server answers at http://127\.0\.0\.1:9"):
        train(spec, sink=MemorySink())

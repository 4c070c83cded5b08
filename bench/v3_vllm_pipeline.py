"""V3: the whole pipeline with vLLM serving in its own process, async vs sync collection.

Candidate: `rl_core.pipeline.runner.train` in ``async`` mode (max_staleness 2, C = 3N
episodes in flight); baseline, same run, same seed: ``sync`` (collect the whole batch, then
train, then collect again). Both roll out through one vLLM CPU server started here (the
runs reach it by ``rollout.vllm_url``, as a user's server), the real `Trainer` trains
``builtin:small`` (head_dim 32, the smallest preset vLLM's CPU attention takes), and the
weights go to the server after every step (in-place reload, probe-checked). Episodes
play ``sim_latency`` on the ``search`` preset (steps of median 50 ms, ~12 turns; capped
at 6 turns here to bound the context).

Reported per mode: steps/s over the steps after the first three (which compile the train
step for new length buckets; after the first only, in a run of 6 steps or fewer), the
trainer's blocked share (waiting for trajectories), the server's weight-update pause
per step. Target (as B2 for the JAX engine): async/sync >= 1.6x steps/s.

    .venv/bin/python -m bench.v3_vllm_pipeline --quick   # 4 steps a mode
    .venv/bin/python -m bench.v3_vllm_pipeline           # 8 steps a mode
    .venv/bin/python -m bench.v3_vllm_pipeline --split   # trainer and server a core each

On a CPU host the trainer and the server share the cores: while the server samples, the
trainer trains on what is left (``--split`` gives each a core of its own, the shape of a
host with an accelerator for each).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

G, B = 4, 4  # N = 16 episodes a step
MAX_CONTEXT = 256
WARMUP = 3  # steps left out of the figures (compiles) when there are more than twice as many


def spec_for(mode: str, url: str, steps: int) -> Any:
    from rl_core.spec import parse_spec

    n = G * B
    return parse_spec(
        {
            "model": {"source": "builtin:small"},
            "environment": {"name": "sim_latency", "config": {"preset": "search"}},
            "agent": {"max_turns": 6, "max_new_tokens": 8, "max_context": MAX_CONTEXT},
            "rollout": {
                "engine": "vllm",
                "vllm_url": url,
                "group_size": G,
                "concurrency": 3 * n if mode == "async" else n,
            },
            "algorithm": {"batch_groups": B, "learning_rate": 1e-3},
            "staleness": {"mode": mode, "max_staleness": 2},
            "train": {"steps": steps, "seed": 0},
        }
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--split",
        action="store_true",
        help="the trainer on core 0, the vLLM server on core 1: two devices, as on a GPU host",
    )
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.quick else 8)
    if args.split:
        # Before JAX starts its thread pool: XLA's threads inherit this process's cores.
        os.sched_setaffinity(0, {0})

    from rl_core.host.sinks import MemorySink
    from rl_core.pipeline.runner import train
    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_model
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig
    from rl_core.spec import ModelSpec

    # The runs build the same initial model (seed 0) and push it before their first step.
    model, _ = load_model(ModelSpec(source="builtin:small"), seed=0)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, folder, untie=True)
        config = VllmServerConfig(
            max_model_len=MAX_CONTEXT,
            max_num_seqs=3 * G * B,
            threads=1 if args.split else None,
            cpus="1" if args.split else None,
        )
        with VllmServer(folder, config, log_path=Path(folder) / "vllm-server.log") as server:
            print(
                f"V3 pipeline with vLLM (server ready in {server.start_s:.0f} s), builtin:small, "
                f"sim_latency search (<= 6 turns), N = {G * B}, {steps} steps a mode"
            )
            for mode in ("sync", "async"):
                sink = MemorySink()
                started = time.perf_counter()
                train(spec_for(mode, server.url, steps), sink=sink)
                wall = time.perf_counter() - started
                # The first steps compile the train step for each new length bucket.
                rows = [m for _, m in sink.steps][WARMUP if steps > 2 * WARMUP else 1 :]
                results[mode] = {
                    "steps_per_s": len(rows) / sum(m["step_time_s"] for m in rows),
                    "blocked": statistics.mean(m["trainer/blocked_frac"] for m in rows),
                    "pause_s": statistics.mean(m.get("vllm/pause_s", 0.0) for m in rows),
                    "step_s": statistics.median(m["step_time_s"] for m in rows),
                    "train_s": statistics.median(m["time/train_step_s"] for m in rows),
                    "wall_s": wall,
                }
                train_s = " ".join(f"{m['time/train_step_s']:.2f}" for _, m in sink.steps)
                print(f"{mode}: train step seconds by step {train_s}")

    print(
        f"{'mode':<6} {'steps/s':>8} {'step s':>7} {'train s':>8} {'blocked':>8} "
        f"{'pause s':>8} {'wall s':>7}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<6} {r['steps_per_s']:>8.3f} {r['step_s']:>7.2f} {r['train_s']:>8.2f} "
            f"{100 * r['blocked']:>7.1f}% {r['pause_s']:>8.3f} {r['wall_s']:>7.0f}"
        )
    gain = results["async"]["steps_per_s"] / results["sync"]["steps_per_s"]
    mark = "PASS" if gain >= 1.6 else "MISS"
    print(f"  {mark}  async/sync steps/s {gain:.2f}x (>= 1.6x)")


if __name__ == "__main__":
    main()

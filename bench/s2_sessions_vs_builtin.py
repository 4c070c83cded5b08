"""S2: a sessions run against the same agent as a built-in environment: trajectories/s.

    .venv/bin/python bench/s2_sessions_vs_builtin.py [--steps 12] [--spec examples/tiny-game.yaml]

Both runs take the spec as it is (model, game, batch, concurrency, staleness) for
``--steps`` steps, one after the other in this process:

- **built-in** (the baseline): ``guess_number`` played by the worker's own agent;
- **sessions**: ``environment: sessions``, the same game played by
  ``examples/guess_number_agent.py`` in a process of its own (``rollout.concurrency``
  agents on the official ``openai`` client, every other answer streamed), through the
  gateway ``rlaas train`` serves: HTTP on loopback, the client's JSON and SSE parsing,
  the session's rendering and record.

By default the learning rate is 1e-12: a policy that does not move plays alike in
both runs, so their trajectories/s compare the paths (``--learning`` trains as the
spec says; then compare model calls/s, as the runs' episodes differ). Printed per run,
over the steps after the first two (compilation): trained trajectories/s and model
calls/s, the mean step time, the trainer's and the engine's busy fractions,
and the reward at the end. The ratio sessions / built-in is the cost of the client-driven path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import table
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import train
from rl_core.spec import JobSpec, load_spec
from worker.gateway import serve_gateway

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "examples" / "guess_number_agent.py"
TOKEN = "s2-gateway-token-0123456789"


def run(spec: JobSpec, *, sessions: bool, spec_path: Path) -> dict[str, float]:
    sink, exits = MemorySink(), []

    @contextlib.asynccontextmanager
    async def gateway(broker: Any) -> AsyncIterator[str]:
        async with serve_gateway(broker, token=TOKEN) as url:
            command = [sys.executable, str(AGENT), "--url", url, "--token", TOKEN]
            command += ["--spec", str(spec_path)]
            client = await asyncio.create_subprocess_exec(*command, cwd=REPO)
            try:
                yield url
            finally:
                exits.append(client.returncode)
                client.terminate()
                await client.wait()

    if sessions:
        environment = spec.environment.model_copy(update={"name": "sessions", "config": {}})
        spec = spec.model_copy(update={"environment": environment})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlaas-s2-") as out:
        train(spec, sink=sink, artifacts_dir=Path(out), gateway=gateway if sessions else None)
    if sessions and exits != [None]:
        raise RuntimeError(f"the client process ended early (exit {exits})")
    measured = [m for step, m in sink.steps if step > 2]
    seconds = sum(m["step_time_s"] for m in measured)
    calls = sum(m["episode/trained"] * m["episode/turns_mean"] for m in measured)
    return {
        "traj_s": sum(m["episode/trained"] for m in measured) / seconds,
        "calls_s": calls / seconds,
        "step_s": seconds / len(measured),
        "trainer_busy": _mean(measured, "trainer/busy_frac"),
        "engine_busy": _mean(measured, "engine/busy_frac"),
        "reward_last": sink.steps[-1][1]["reward/mean"],
        "wall_s": time.perf_counter() - started,
    }


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "tiny-game.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--learning",
        action="store_true",
        help="train as the spec says (the runs then play differently: compare calls/s)",
    )
    args = parser.parse_args()
    base = load_spec(args.spec)
    spec = base.model_copy(update={"train": base.train.model_copy(update={"steps": args.steps})})
    if not args.learning:
        # A policy that barely moves plays alike in both runs (the same episode lengths),
        # so trajectories/s compares the paths, not how fast each run happened to learn.
        algorithm = spec.algorithm.model_copy(update={"learning_rate": 1e-12})
        spec = spec.model_copy(update={"algorithm": algorithm})
    results = {
        "built-in": run(spec, sessions=False, spec_path=args.spec),
        "sessions": run(spec, sessions=True, spec_path=args.spec),
    }
    rows = [
        (
            name,
            f"{r['traj_s']:.1f}",
            f"{r['calls_s']:.1f}",
            f"{r['step_s']:.2f}",
            f"{r['trainer_busy']:.2f}",
            f"{r['engine_busy']:.2f}",
            f"{r['reward_last']:.3f}",
            f"{r['wall_s']:.0f}",
        )
        for name, r in results.items()
    ]
    header = (
        "run",
        "traj/s",
        "calls/s",
        "s/step",
        "trainer busy",
        "engine busy",
        "reward (last)",
        "wall s",
    )
    print(table(header, rows))
    ratio = results["sessions"]["traj_s"] / results["built-in"]["traj_s"]
    print(f"sessions / built-in trajectories/s: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

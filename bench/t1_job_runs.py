"""T1 for job runs (issue #34, item 1): K LoRA job runs of one base hosted by one worker
process at once, sharing the base (docs/shared-base.md), against the same K runs one after
another, and against K at once each on its own copy of the base.

Each mode runs in a fresh Python process (so one mode's memory never lingers in the
next's figures), and each run is `rl_core.pipeline.runner.train` on the spec, the path a
worker takes (a worker with ``RLAAS_RUNS_PER_WORKER=K`` runs it in K threads with one
`Colocation`, as ``shared`` does here):

- ``sequential``: the K runs one after another, each loading its base (one run a worker,
  the default);
- ``shared``: the K runs at once in K threads with one `Colocation` (one base, fair
  turns on the device);
- ``separate``: the K runs at once in K threads, each with its own base and no turns:
  what sharing saves against merely running at once.

The runs differ only in their learning rate (so each trains its own adapters). Reported:
the wall, the trajectories all K trained on over it, the process's peak RSS (polled every
20 ms) and, for ``shared``, each run's device seconds (the fairness).

    .venv/bin/python -m bench.t1_job_runs [--model tiny|smollm2] [--ks 2] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SPECS = {
    "tiny": REPO / "examples" / "tiny-game-short.yaml",
    "smollm2": REPO / "examples" / "smollm2-tool-use.yaml",
}
MODES = ("sequential", "shared", "separate")


def spec_for(model: str, steps: int, index: int) -> Any:
    from rl_core.spec import parse_spec

    data = yaml.safe_load(SPECS[model].read_text())
    data.setdefault("model", {}).setdefault("lora", {"rank": 8})
    data["train"] = {**data.get("train", {}), "steps": steps, "eval_interval": 0}
    data["algorithm"]["learning_rate"] = data["algorithm"]["learning_rate"] * (1 + index)
    if model == "smollm2":  # two steps of a smaller batch: memory and a first figure
        data["rollout"] = {**data["rollout"], "group_size": 4, "concurrency": 16}
        data["algorithm"] = {**data["algorithm"], "batch_groups": 2, "micro_batches": 2}
        data["staleness"] = {"mode": "async", "max_staleness": 1}
    return parse_spec(data)


class PeakRss:
    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            with open("/proc/self/status") as f:
                line = next(x for x in f if x.startswith("VmRSS:"))
            self.peak_mb = max(self.peak_mb, int(line.split()[1]) / 1024)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def one_mode(model: str, mode: str, k: int, steps: int) -> dict[str, Any]:
    """Run the K runs in ``mode`` in this process; its figures."""
    from rl_core.host.sinks import MemorySink
    from rl_core.pipeline.colocation import Colocation
    from rl_core.pipeline.runner import train

    specs = [spec_for(model, steps, i) for i in range(k)]
    sinks = [MemorySink() for _ in specs]
    colocation = Colocation() if mode == "shared" else None
    used: dict[str, float] = {}

    def run(i: int) -> None:
        train(specs[i], sink=sinks[i], colocation=colocation, episode_prefix=f"r{i}-")

    def watch() -> None:  # the device share's accounts leave with their runs: read live
        while colocation is not None and any(t.is_alive() for t in threads):
            used.update(colocation.device.used())
            time.sleep(0.05)

    rss = PeakRss()
    started = time.perf_counter()
    threads: list[threading.Thread] = []
    if mode == "sequential":
        for i in range(k):
            run(i)
    else:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        watch()
        for t in threads:
            t.join()
    wall = time.perf_counter() - started
    peak = rss.stop()
    # Trained on: every step takes batch_groups groups of group_size.
    trajectories = sum(
        len(s.steps) * spec.algorithm.batch_groups * spec.rollout.group_size
        for s, spec in zip(sinks, specs, strict=True)
    )
    return {
        "mode": mode,
        "k": k,
        "wall_s": round(wall, 1),
        "trajectories": trajectories,
        "traj_per_s": round(trajectories / wall, 2),
        "peak_rss_mb": round(peak),
        "device_s": {name: round(s, 1) for name, s in used.items()},
        "steps": [len(s.steps) for s in sinks],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SPECS), default="tiny")
    parser.add_argument("--ks", default="2")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # MODE:K, in the child process
    args = parser.parse_args()
    steps = args.steps or (12 if args.model == "tiny" else 2)
    if args.one:
        mode, k = args.one.split(":")
        print(json.dumps(one_mode(args.model, mode, int(k), steps)), flush=True)
        return
    rows = []
    for k in (int(x) for x in args.ks.split(",")):
        for mode in args.modes.split(","):
            cmd = [sys.executable, "-m", "bench.t1_job_runs", "--model", args.model]
            cmd += ["--steps", str(steps), "--one", f"{mode}:{k}"]
            out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nT1 job runs, {args.model}, {steps} steps each")
    print(f"{'K':>2} {'mode':<11} {'wall s':>7} {'traj':>6} {'traj/s':>7} {'peak RSS MB':>12}")
    for r in rows:
        print(
            f"{r['k']:>2} {r['mode']:<11} {r['wall_s']:>7} {r['trajectories']:>6} "
            f"{r['traj_per_s']:>7} {r['peak_rss_mb']:>12}  {r['device_s'] or ''}"
        )


if __name__ == "__main__":
    main()

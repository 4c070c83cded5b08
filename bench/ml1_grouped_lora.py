"""ML1: S LoRA adapters on one base in one program, against one merged program per adapter.

A batch of B rows, B / S per adapter slot, through the random-init ``small`` model
(d_model 192, 4 layers, d_ff 512) with LoRA on all seven targets (q k v o gate up down):

- ``gather``: one program, unmerged adapters, each row's A[s], B[s] gathered (einsum);
- ``ragged``: one program, unmerged adapters, tokens sorted by slot, `jax.lax.ragged_dot`;
- ``merged x S`` (baseline, today's path): for each slot in turn, merge its adapter into
  the base weights and run its B / S rows, S calls one after another.

Each is timed as a forward (logits) and as a forward+backward (gradient of a summed
cross-entropy w.r.t. the adapters, what a training call runs), compiled first, then the
median of ``--repeats`` calls. One process, the three candidates alternate.

    .venv/bin/python -m bench.ml1_grouped_lora [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())  # type: ignore[no-untyped-call]  # compile and warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one shape, 3 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    print(f"model small: {_row_header()}")
    print("| S | r | B x T | pass | gather ms | ragged ms | merged x S ms | best/merged |")
    print("|---|---|---|---|---|---|---|---|")
    shapes = [(4, 8, 8, 128), (8, 16, 16, 128)]  # (S, rank, B, T)
    for shape in shapes[:1] if args.quick else shapes:
        for pass_name in ("forward", "fwd+bwd"):
            ms = _one(
                *shape, backward=pass_name == "fwd+bwd", repeats=3 if args.quick else args.repeats
            )
            best = min(ms["gather"], ms["ragged"])
            n_slots, rank, rows, length = shape
            cells = [n_slots, rank, f"{rows} x {length}", pass_name]
            cells += [f"{ms[k]:.1f}" for k in ("gather", "ragged", "merged")]
            cells.append(f"{best / ms['merged']:.2f}")
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def _row_header() -> str:
    from rl_core.models import ModelConfig

    c = ModelConfig.small()
    return f"d_model {c.d_model}, {c.n_layers} layers, d_ff {c.d_ff}, vocab {c.vocab_size}"


def _one(
    n_slots: int, rank: int, rows: int, length: int, *, backward: bool, repeats: int
) -> dict[str, float]:
    """Median ms of gather, ragged and the merged baseline at one shape, one pass."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rl_core.models import Model, ModelConfig
    from rl_core.training.lora import LoraConfig, merged_params
    from rl_core.training.multi_lora import init_stacked, multi_lora_model, slot_adapters

    config = ModelConfig.small()
    graphdef, base, rest = nnx.split(Model(config, rngs=nnx.Rngs(0)), nnx.Param, ...)  # type: ignore[misc]
    targets_ = ("q", "k", "v", "o", "gate", "up", "down")
    lora = LoraConfig(rank=rank, alpha=float(rank), targets=targets_)
    # B != 0 (a fresh adapter's B = 0 costs the same, but keep the numbers honest).
    stacked = jax.tree.map(lambda x: x + 0.01, init_stacked(base, lora, jax.random.key(0), n_slots))
    tokens = jax.random.randint(jax.random.key(1), (rows, length), 0, config.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    per = rows // n_slots
    slots = jnp.repeat(jnp.arange(n_slots, dtype=jnp.int32), per)  # B / S rows per slot

    def positions(tok: jax.Array) -> jax.Array:
        return jnp.broadcast_to(jnp.arange(length), tok.shape)

    def ce(logits: jax.Array, tgt: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.sum(jnp.take_along_axis(logp, tgt[..., None], axis=-1))

    def multi(st: Any, impl: Any) -> jax.Array:
        m = multi_lora_model(graphdef, base, rest, st, slots, lora, impl=impl)
        return m(tokens, positions(tokens))[0]  # type: ignore[no-any-return]

    def single(ad: Any, tok: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, merged_params(base, ad, lora), rest)
        return m(tok, positions(tok))[0]  # type: ignore[no-any-return]

    ms = {}
    for impl in ("gather", "ragged"):
        if backward:
            fn = jax.jit(jax.grad(lambda st, impl=impl: ce(multi(st, impl), targets)))
        else:
            fn = jax.jit(functools.partial(multi, impl=impl))
        ms[impl] = _median_ms(functools.partial(fn, stacked), repeats)
    adapters = [slot_adapters(stacked, s) for s in range(n_slots)]
    chunks = [
        (tokens[s * per : (s + 1) * per], targets[s * per : (s + 1) * per]) for s in range(n_slots)
    ]
    if backward:
        one = jax.jit(jax.grad(lambda ad, tok, tgt: ce(single(ad, tok), tgt)))
    else:
        one = jax.jit(lambda ad, tok, tgt: single(ad, tok))

    def in_turn() -> list[Any]:  # today's path: each adapter merged, its rows alone, in turn
        return [one(ad, tok, tgt) for ad, (tok, tgt) in zip(adapters, chunks, strict=True)]

    ms["merged"] = _median_ms(in_turn, repeats)
    return ms


if __name__ == "__main__":
    main()

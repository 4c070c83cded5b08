"""Does vLLM (CPU) serve a checkpoint's PEFT export with ``--enable-lora`` as rlaas scores it?

A tiny random model (head_dim 32: vLLM's CPU attention refuses less) with LoRA adapters
moved off their initial values is checkpointed and exported (`rl_core.training.exports`);
its base is exported as a Hugging Face folder. A vLLM server from ``.venv-vllm`` serves
the base with the adapter under the name ``adapter``; prompt logprobs of fixed prompts,
through the adapter and through the base alone, are compared with the trainer's (float32).
A manual check, not a test: a vLLM start costs CI a minute (docs/exports.md).

    .venv/bin/python bench/exports_vllm_lora.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

TEXTS = ["Guess the number between 1 and 8.", "higher", "Answer with a number: 5"]


def main() -> None:
    import jax
    from flax import nnx

    from rl_core.models import Model, ModelConfig
    from rl_core.models.tokenizer import BuiltinTokenizer
    from rl_core.pretrained.export import export_hf
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig
    from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint
    from rl_core.training.exports import export_all
    from rl_core.training.lora import LoraConfig
    from rl_core.training.trainer import Trainer, TrainerConfig

    tokenizer = BuiltinTokenizer()
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, n_heads=2, n_kv_heads=1, head_dim=32)
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    base = Model(config, rngs=nnx.Rngs(0))
    trainer = Trainer(base, TrainerConfig(lora=lora))
    leaves, treedef = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    trainer.trainable = jax.tree.unflatten(
        treedef,
        [
            x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys, strict=True)
        ],
    )
    work = Path(tempfile.mkdtemp(prefix="rlaas-vllm-lora-"))
    ckpt = Path(save_checkpoint(checkpoint_dir(work, 1), step=1, trainer=trainer, extra={}).uri)
    _, peft = export_all(ckpt, work / "run", 1, base=base, tokenizer=tokenizer, lora=lora)
    base_dir = export_hf(base, work / "base", tokenizer=tokenizer)
    server = VllmServer(
        base_dir,
        VllmServerConfig(
            max_model_len=64,
            max_num_seqs=4,
            extra_args=(
                "--enable-lora",
                "--lora-modules",
                f"adapter={peft}",
                "--max-lora-rank",
                "8",
            ),
        ),
        log_path=work / "vllm.log",
    )
    t = time.perf_counter()
    server.start()
    print(f"vLLM up in {time.perf_counter() - t:.0f} s (log {work / 'vllm.log'})")
    try:
        for name, reference in (("adapter", trainer), ("policy", Trainer(base, TrainerConfig()))):
            worst = 0.0
            for text in TEXTS:
                ids = [tokenizer.token_id("<|user|>"), *tokenizer.encode(text)]
                want = reference.logprobs(np.asarray([ids], np.int32))[0, 1:]
                r = httpx.post(
                    f"{server.url}/v1/completions",
                    json={"model": name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0},
                    timeout=120,
                )
                r.raise_for_status()
                rows = r.json()["choices"][0]["prompt_logprobs"][1:]
                got = [float(row[str(t)]["logprob"]) for row, t in zip(rows, ids[1:], strict=True)]
                worst = max(worst, float(np.max(np.abs(np.asarray(got) - want))))
            print(f"{name}: max |d logprob| vs rlaas {worst:.2e}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

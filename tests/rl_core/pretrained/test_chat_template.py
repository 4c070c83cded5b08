"""Chat templates render exactly as transformers' apply_chat_template(tokenize=False)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rl_core.pretrained import (
    ChatTemplateError,
    Checkpoint,
    load_checkpoint,
    render_chat_template,
)
from tests.rl_core.pretrained.conftest import TinyModel

CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? 日本 🙂"},
]
NO_SYSTEM = CONVERSATION[1:]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city, «today».",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
WITH_TOOL = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp_c": 21, "sky": "clear"}'},
    {"role": "assistant", "content": "21 °C and clear."},
    {"role": "user", "content": "Thanks"},
]


@pytest.mark.parametrize("messages", [CONVERSATION, NO_SYSTEM, WITH_TOOL])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_smollm2_template_renders_as_transformers(
    smollm2: Checkpoint,
    hf_smollm2_tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    assert smollm2.chat_template is not None
    before = copy.deepcopy(messages)
    ours = render_chat_template(
        smollm2.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        special_tokens=smollm2.tokenizer.special_tokens,
    )
    theirs = hf_smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n") is add_generation_prompt
    assert messages == before


@pytest.mark.parametrize("messages", [CONVERSATION, NO_SYSTEM, WITH_TOOL])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_tiny_template_with_tools_renders_as_transformers(
    tiny_models: dict[str, TinyModel],
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
) -> None:
    from transformers import AutoTokenizer

    path = tiny_models["qwen2"].path
    ckpt = load_checkpoint(f"hf:{path}")
    assert ckpt.chat_template is not None
    ours = render_chat_template(
        ckpt.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        special_tokens=ckpt.tokenizer.special_tokens,
    )
    theirs = AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs
    assert ours.startswith("<|endoftext|>")
    if tools:
        assert '"description": "Weather in a city, «today»."' in ours
    if messages is WITH_TOOL:
        assert "<tool_response>\n" in ours and '"arguments": {"city": "Paris"}' in ours


def test_raise_exception_becomes_a_chat_template_error(tiny_models: dict[str, TinyModel]) -> None:
    ckpt = load_checkpoint(f"hf:{tiny_models['qwen2'].path}")
    assert ckpt.chat_template is not None
    with pytest.raises(ChatTemplateError, match="unknown role critic"):
        render_chat_template(ckpt.chat_template, [{"role": "critic", "content": "meh"}])


def test_template_that_does_not_compile_fails() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template("{% for m in messages %}", [])


def test_sandbox_refuses_attribute_escapes() -> None:
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__ }}", [])

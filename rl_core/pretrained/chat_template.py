"""Rendering a model's own Jinja2 chat template, as transformers' ``apply_chat_template`` does.

The template is untrusted code from the checkpoint, so it runs in jinja2's immutable sandbox.
The environment matches the one transformers builds, so a template renders to the same text:

- ``trim_blocks`` and ``lstrip_blocks`` on; the ``loopcontrols`` extension (``break``,
  ``continue``); a ``{% generation %}...{% endgeneration %}`` block that renders its body;
- ``tojson`` that does not HTML-escape (``json.dumps(x, ensure_ascii=False, ...)`` with
  ``indent``, ``separators``, ``sort_keys``);
- globals ``raise_exception(msg)`` (raises `ChatTemplateError`) and ``strftime_now(fmt)``,
  next to jinja2's own (``namespace``, ``dict``, ``range``); the sandbox already refuses
  ``_``-prefixed attribute access;
- messages normalised the same way: keys whose value is None dropped (``content=None`` from
  an OpenAI-style client), and a message's reasoning given under every name templates read
  (``reasoning_content``, ``thinking``, from whichever of those or ``reasoning`` is set);
- variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special
  tokens by name (``bos_token``, ``eos_token``, ...) and any extra keyword (e.g.
  ``enable_thinking``).

Where to find a template: ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{"name", "template"}`` of which ``default`` is taken), a ``chat_template.jinja`` file next to
it (transformers >= 4.52 saves it there), or a GGUF's ``tokenizer.chat_template``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rl_core.pretrained.errors import ChatTemplateError

Message = Mapping[str, Any]


def render_chat_template(
    template: str,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    special_tokens: Mapping[str, str] | None = None,
    **extra: Any,
) -> str:
    """The conversation as the model's template writes it (``tokenize=False`` text).

    ``tools`` are JSON-schema dicts (``{"type": "function", "function": {...}}``), passed to
    the template as given. Raises `ChatTemplateError` if the template does not compile or
    calls ``raise_exception`` (e.g. for a role order it does not accept).
    """
    compiled = _compile(template)
    variables: dict[str, Any] = {**(special_tokens or {}), **extra}
    try:
        return compiled.render(
            messages=[_alias_reasoning(_drop_none(_plain(m))) for m in messages],
            tools=None if tools is None else [_plain(t) for t in tools],
            documents=None if documents is None else [_plain(d) for d in documents],
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as err:
        raise ChatTemplateError(f"chat template failed while rendering: {err}") from err


def chat_template_from_hf_dir(directory: str | Path) -> str | None:
    """The chat template a Hugging Face folder carries, or None."""
    directory = Path(directory)
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    config_file = directory / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    try:
        value = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
    except (ValueError, AttributeError) as err:
        raise ChatTemplateError(f"{config_file}: not a JSON object ({err})") from err
    if isinstance(value, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _plain(value: Any) -> Any:
    """Deep copy of dicts/lists/tuples, so a template never mutates the caller's messages."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _drop_none(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if value is not None}


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-style templates read ``reasoning_content``, gpt-oss ones ``thinking``: fill both."""
    reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks the assistant's tokens; render the body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as err:
        raise ChatTemplateError(f"chat template does not compile: {err}") from err

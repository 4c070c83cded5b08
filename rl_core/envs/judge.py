"""`LLMJudge`: the ``judge`` verifier, an LLM that scores a whole GRPO group in one call.

The RULER pattern: the judge reads the task once and every answer of the group
together, against the tenant's rubric, and gives each a score from 0 to 1 in one JSON
object. Seeing the answers side by side lets it rank them consistently, which is what
GRPO's advantages need (the group's differences, not absolute marks), at one call per
group instead of one per episode.

The judge is any OpenAI-compatible server (``POST {url}/chat/completions``) registered
like a webhook environment (``POST /v1/environments``: its URL through the address
checks, its API key as the encrypted secret, sent here as ``Authorization: Bearer``).
The bytes go through the webhook environments' transport (`AiohttpTransport`), so the
same wall stands at every connection: a worker of a deployment connects to no
loopback, private or metadata address for a judge either. The OpenAI client is not used:
it would bring its own HTTP stack, around that wall rather than through it.

A call that fails fails its group's answers, counted by reason (`JUDGE_REASONS`), never
scored 0: ``budget`` (the run spent ``max_calls`` or ``max_tokens``), ``timeout``,
``malformed`` (no JSON object with a score from 0 to 1 for that answer; a reply that
misses one answer fails that answer only), ``address_refused`` (the wall), ``error``
(no connection, or an HTTP error left after the retries).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.envs.transport import (
    AddressRefused,
    AiohttpTransport,
    Transport,
    TransportError,
    TransportFactory,
)
from rl_core.envs.webhook import WebhookTarget
from rl_core.spec import JudgeSpec

JUDGE_REASONS = ("budget", "timeout", "malformed", "error", "address_refused")

# What the judge reads of each answer and of the task: the end of an answer is where its
# result is, and a group of long answers must not make one request unbounded.
ANSWER_CHARS = 6000
TASK_CHARS = 12000

SYSTEM = """You are a careful judge of answers to a task. Score each answer from 0 to 1
against the rubric below: 1 fully meets it, 0 not at all; use the range between to
rank partial answers. Compare the answers with each other: a better answer gets a
higher score. Answer with one JSON object only, of this form:
{{"scores": [{{"id": "a1", "reason": "<one short sentence>", "score": <0..1>}}, ...]}}
with one entry for every answer id.

Rubric:
{rubric}"""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "reason": {"type": "string"},
                    "score": {"type": "number"},
                },
                "required": ["id", "reason", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One answer to judge: the task's messages (the reset's), the final message, and the
    row's reference when it has one (the judge is told it may use it)."""

    prompt: tuple[Mapping[str, Any], ...]
    answer: str
    reference: Any = None


class JudgeFailed(Exception):
    """The judge gave no score for an answer; ``reason`` is one of `JUDGE_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class LLMJudge:
    """One per run: its budget, its connection pool and its request counts."""

    def __init__(
        self,
        target: WebhookTarget,
        spec: JudgeSpec,
        *,
        transport: TransportFactory | None = None,
        backoff_s: float = 1.0,
    ) -> None:
        self.target = target
        self.spec = spec
        self.url = target.url.rstrip("/") + "/chat/completions"
        self.backoff_s = backoff_s
        self._make_transport = transport or (
            lambda cap: AiohttpTransport(cap, allowlist=target.allowlist)
        )
        self._client: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._structured = spec.structured
        self.calls = 0  # calls started, retries included: the budget's count
        self.tokens = 0  # the servers' usage, summed
        self.groups = 0  # groups (calls that scored) and answers judged
        self.answers = 0
        self.failures: collections.Counter[str] = collections.Counter()  # answers, by reason
        self._reported: dict[str, float] = {}

    async def score(self, items: Sequence[JudgeItem]) -> list[float | JudgeFailed]:
        """A score from 0 to 1 for each item, or why it has none; one call for them all."""
        if not items:
            return []
        try:
            scores = await self._call(items)
        except JudgeFailed as exc:
            self.failures[exc.reason] += len(items)
            return [exc] * len(items)
        out: list[float | JudgeFailed] = []
        for i, value in enumerate(scores):
            if value is None:
                self.failures["malformed"] += 1
                out.append(JudgeFailed("malformed", f"the judge gave no score for answer a{i + 1}"))
            else:
                out.append(value)
        self.groups += 1
        self.answers += sum(isinstance(v, float) for v in out)
        return out

    async def _call(self, items: Sequence[JudgeItem]) -> list[float | None]:
        client, slots = self._bind()
        attempt = 0
        async with slots:
            while True:
                self._spend()
                body = json.dumps(self._request(items)).encode()
                try:
                    answer = await client.post(self.url, body, self._headers(), self.spec.timeout_s)
                except TimeoutError:
                    raise JudgeFailed(
                        "timeout", f"the judge gave no answer in {self.spec.timeout_s:g} s"
                    ) from None
                except AddressRefused as exc:
                    raise JudgeFailed("address_refused", str(exc)) from None
                except TransportError as exc:
                    if attempt < self.spec.retries:
                        attempt += 1
                        await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                        continue
                    raise JudgeFailed("error", f"POST {self.url}: {exc}") from None
                if answer.status in (400, 422) and self._structured:
                    # No json_schema here (many servers): ask once more without it, and
                    # never again this run.
                    self._structured = False
                    continue
                if (answer.status == 429 or answer.status >= 500) and attempt < self.spec.retries:
                    attempt += 1
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                if answer.status != 200:
                    text = answer.body[:300].decode("utf-8", "replace")
                    raise JudgeFailed(
                        "error", f"POST {self.url}: HTTP {answer.status} {answer.reason}: {text}"
                    )
                return self._read(answer.body, len(items), len(body))

    def _spend(self) -> None:
        spec = self.spec
        if self.calls >= spec.max_calls:
            raise JudgeFailed(
                "budget", f"the run's judge budget of {spec.max_calls} calls is spent"
            )
        if self.tokens >= spec.max_tokens:
            raise JudgeFailed(
                "budget",
                f"the run's judge budget of {spec.max_tokens} tokens is spent ({self.tokens})",
            )
        self.calls += 1  # before the call: concurrent groups cannot pass the budget together

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.target.secret}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }

    def _request(self, items: Sequence[JudgeItem]) -> dict[str, Any]:
        first = items[0]  # a group's members share the task
        task = "\n\n".join(
            f"[{m.get('role', 'user')}]\n{m['content']}"
            for m in first.prompt
            if isinstance(m.get("content"), str)
        )[-TASK_CHARS:]
        parts = [f"# Task\n{task}"]
        if first.reference is not None:
            parts.append(f"# Reference answer (for the judge; may be used)\n{first.reference}")
        for i, item in enumerate(items):
            parts.append(f"# Answer a{i + 1}\n{item.answer[-ANSWER_CHARS:]}")
        ids = ", ".join(f"a{i + 1}" for i in range(len(items)))
        parts.append(f"Score every answer: {ids}.")
        request: dict[str, Any] = {
            "model": self.spec.model,
            "messages": [
                {"role": "system", "content": SYSTEM.format(rubric=self.spec.rubric)},
                {"role": "user", "content": "\n\n".join(parts)},
            ],
            "max_tokens": self.spec.reply_tokens,
            "temperature": 0,
        }
        if self._structured:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "scores", "strict": True, "schema": SCHEMA},
            }
        return request

    def _read(self, raw: bytes, n: int, sent_bytes: int) -> list[float | None]:
        try:
            reply = json.loads(raw)
            content = reply["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeFailed(
                "malformed", f"not a chat completion: {raw[:200].decode('utf-8', 'replace')!r}"
            ) from None
        usage = reply.get("usage") if isinstance(reply, dict) else None
        total = usage.get("total_tokens") if isinstance(usage, dict) else None
        if isinstance(total, int) and total >= 0:
            self.tokens += total
        else:  # a server that reports no usage: about 4 bytes a token, both ways
            self.tokens += (sent_bytes + len(raw)) // 4
        if not isinstance(content, str):
            raise JudgeFailed("malformed", "the judge's message has no text")
        found = scores_of(content, n)
        if found is None:
            raise JudgeFailed("malformed", f"no JSON object of scores in {content[:200]!r}")
        return found

    def _bind(self) -> tuple[Transport, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._slots is None:
            self._loop = loop
            self._client = self._make_transport(self.target.max_concurrency)
            self._slots = asyncio.Semaphore(self.target.max_concurrency)
        return self._client, self._slots

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def step_metrics(self) -> dict[str, float]:
        """``env/judge/...``: calls and tokens spent (totals), groups and answers scored
        since the last call; the failures are the caller's (``env/verifier_failed``)."""
        now = {"groups": float(self.groups), "answers": float(self.answers)}
        since = {k: v - self._reported.get(k, 0.0) for k, v in now.items()}
        self._reported = now
        return {
            "env/judge/calls": float(self.calls),
            "env/judge/tokens": float(self.tokens),
            **{f"env/judge/{k}": v for k, v in since.items()},
        }


_ID = re.compile(r"^\s*a?\s*(\d+)\s*$", re.IGNORECASE)


def scores_of(content: str, n: int) -> list[float | None] | None:
    """The scores of answers ``a1..an`` in a judge's reply, None where an answer has none
    (or one outside 0..1); None when the reply holds no JSON object of scores.

    Robust to what judges write: the object inside a code fence or prose (the first
    ``{`` from which a whole object parses and that has ``scores``), scores as a list of
    ``{id, score}`` (ids ``a1``, ``1`` or a number) or as an object ``{"a1": 0.5}``, or a
    list of bare numbers in the answers' order."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", content)):
        try:
            value, _ = decoder.raw_decode(content, start)
        except ValueError:
            continue
        if isinstance(value, dict) and "scores" in value:
            return _by_answer(value["scores"], n)
    return None


def _by_answer(scores: Any, n: int) -> list[float | None] | None:
    out: list[float | None] = [None] * n
    if isinstance(scores, dict):
        pairs = list(scores.items())
    elif isinstance(scores, list) and all(_number(s) is not None for s in scores):
        pairs = [(i + 1, s) for i, s in enumerate(scores)]
    elif isinstance(scores, list):
        pairs = [
            (s.get("id", s.get("answer")), s.get("score")) for s in scores if isinstance(s, dict)
        ]
    else:
        return None
    for key, raw in pairs:
        index = _index(key)
        value = _number(raw)
        if index is not None and 1 <= index <= n and value is not None and 0 <= value <= 1:
            out[index - 1] = value
    return out


def _index(key: Any) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    match = _ID.match(key) if isinstance(key, str) else None
    return int(match.group(1)) if match else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


__all__ = ["JUDGE_REASONS", "JudgeFailed", "JudgeItem", "LLMJudge", "scores_of"]

"""A fake OpenAI-compatible judge on loopback: ``POST /v1/chat/completions`` answered as a
hosted model would be (a chat completion with ``usage``), its reply chosen by ``mode``.

It scores answer ``a<i>`` of a request ``i * scale`` (``i / 10`` by default, so each
answer's score is known), and keeps every request it got, with its headers, for the
tests to read."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

USAGE_TOKENS = 100  # what every answer reports as its total usage


@dataclasses.dataclass
class FakeJudge:
    # ok | fenced (JSON inside prose and a code fence) | missing_one (no score for the
    # last answer) | prose (no JSON at all) | slow (answers after `delay_s`) | no_schema
    # (400 to a request with response_format, as servers without structured output do)
    mode: str = "ok"
    delay_s: float = 0.0
    scale: float = 0.1  # answer a<i> scores i * scale
    requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    headers: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.mode == "no_schema" and "response_format" in body:
            return JSONResponse({"error": {"message": "response_format not supported"}}, 400)
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        ids = re.findall(r"^# Answer (a\d+)$", body["messages"][1]["content"], re.MULTILINE)
        scores = [{"id": i, "reason": "as scripted", "score": int(i[1:]) * self.scale} for i in ids]
        if self.mode == "missing_one":
            scores = scores[:-1]
        content = json.dumps({"scores": scores})
        if self.mode in ("fenced", "no_schema"):
            content = f"Here are my scores.\n```json\n{content}\n```\nDone."
        if self.mode == "prose":
            content = "All of the answers look fine to me."
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": USAGE_TOKENS - 10,
                    "completion_tokens": 10,
                    "total_tokens": USAGE_TOKENS,
                },
            }
        )

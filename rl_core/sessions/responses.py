"""A session's Responses API calls: translated onto its chat calls, kept by id.

`ResponseStore.respond` turns a ``POST /responses`` request into the chat request it
stands for (`rl_core.protocol.responses.to_chat`), has it answered by the session's
chat entry point (`ChatSession.complete`, or the broker's wrapper of it, which adds the
call to the timeline), and keeps the conversation (input and answer, as chat messages)
under the response's id, so a later call's ``previous_response_id`` continues it. The
ledger sees one chat call: the same prompt tokens, the same record, token-exact.

Responses are kept until the session ends (they are the session's conversation,
held in the worker's memory with its calls), whatever ``store`` says.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rl_core.protocol.chat_completions import ChatCompletion, ChatCompletionRequest
from rl_core.protocol.responses import Response, ResponsesRequest, from_chat, not_found, to_chat

Complete = Callable[[ChatCompletionRequest], Awaitable[ChatCompletion]]


class ResponseStore:
    """One session's responses, by id: each the chat messages it continues from."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._conversations: dict[str, list[dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._conversations)

    def history(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation ``response_id`` ended with (input and answer), [] for None."""
        if response_id is None:
            return []
        conversation = self._conversations.get(response_id)
        if conversation is None:
            raise not_found(response_id)
        return conversation

    async def respond(self, request: ResponsesRequest, complete: Complete) -> Response:
        """Answer ``request`` with ``complete`` (a chat call of this session) and keep it."""
        chat, conversation = to_chat(request, self.history(request.previous_response_id))
        answer = await complete(chat)
        # The chat id ends with the call's turn in the ledger: unique in the session.
        turn = answer.id.rsplit("-", 1)[-1]
        response = from_chat(
            answer,
            request,
            response_id=f"resp_{self.session_id}_{turn}",
            item_prefix=f"{self.session_id}_{turn}",
        )
        self._conversations[response.id] = [
            *conversation,
            answer.choices[0].message.echo(),
        ]
        return response


__all__ = ["Complete", "ResponseStore"]

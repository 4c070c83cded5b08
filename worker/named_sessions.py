"""Sessions named per request: one base URL (and the run's token) for many sessions.

A framework that shares one OpenAI client between its rollouts (verifiers sends each
rollout's id as ``X-Session-ID``; an agent may name it in ``model``) cannot hold a
base URL and key per session. On the gateway's shared URL (``/v1/openai``) each call
names its session:

- the header ``X-Session-ID: <name>`` (verifiers' own header name), or else
- the body's ``"model": "session:<name>"``.

The first call with a name opens a session for it (its group from
``X-Session-Group``, waiting up to ``X-Session-Wait`` seconds, default 60, for a
free episode, as ``POST /v1/sessions`` does with ``wait_s``); later calls with that
name are that session's. The client ends it with its reward at
``/v1/openai/sessions/<name>/end`` (or ``/cancel``). A name is a run's: once its
session has ended, a call naming it again is refused (409) rather than opening a
second episode under the same name.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Mapping

from rl_core.protocol.chat_completions import ChatCompletionError
from rl_core.sessions.broker import SessionBroker

SESSION_HEADER = "X-Session-ID"
MODEL_PREFIX = "session:"
MAX_NAME = 200
MAX_NAMES = 100_000  # names remembered per run (oldest forgotten first)


def session_name(headers: Mapping[str, str], body: bytes) -> str:
    """The session a shared-URL call names (the header first, then ``model``)."""
    name = headers.get(SESSION_HEADER)
    if name is None:
        model = _model(body)
        if model is not None and model.startswith(MODEL_PREFIX):
            name = model[len(MODEL_PREFIX) :]
    if not name:
        raise ChatCompletionError(
            f"this URL serves many sessions: name this call's session with the header "
            f"'{SESSION_HEADER}: <id>' or with model '{MODEL_PREFIX}<id>' (any id of yours, "
            "the same on every call of one episode)",
            param=SESSION_HEADER,
            code="missing_required_parameter",
        )
    if len(name) > MAX_NAME:
        raise ChatCompletionError(
            f"a session's name is at most {MAX_NAME} characters, not {len(name)}",
            param=SESSION_HEADER,
        )
    return name


def _model(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # the route's own parser names what is wrong with the body
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


class NamedSessions:
    """The sessions opened for names: name -> (session id, session key)."""

    def __init__(self, broker: SessionBroker) -> None:
        self.broker = broker
        self._names: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._opening: dict[str, asyncio.Future[tuple[str, str]]] = {}

    async def resolve(self, name: str, group: str | None, *, wait_s: float) -> tuple[str, str]:
        """The session named ``name``, opened (in ``group``) if this is its first call."""
        if name in self._names:
            return self._open(name)
        pending = self._opening.get(name)
        if pending is not None:  # its first call is still waiting for an episode
            return await asyncio.shield(pending)
        if group is not None and not 0 < len(group) <= MAX_NAME:
            raise ChatCompletionError(
                f"X-Session-Group must be 1 to {MAX_NAME} characters (e.g. your task's id)",
                param="X-Session-Group",
            )
        future = self._opening[name] = asyncio.get_running_loop().create_future()
        try:
            session = await self.broker.open(group, wait_s=wait_s)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no warning when no other call waited
            raise
        finally:
            del self._opening[name]
        found = (session.session_id, session.key)
        self._names[name] = found
        while len(self._names) > MAX_NAMES:
            self._names.popitem(last=False)
        future.set_result(found)
        return found

    def lookup(self, name: str) -> tuple[str, str]:
        """The session a name opened (to end or cancel it); 404 for a name never used."""
        if name not in self._names:
            raise ChatCompletionError(
                f"no session is named {name!r} on this run: a name's first call opens it",
                code="session_not_found",
                status=404,
            )
        return self._names[name]

    def _open(self, name: str) -> tuple[str, str]:
        sid, key = self._names[name]
        try:
            self.broker.session(sid, key)
        except ChatCompletionError:
            raise ChatCompletionError(
                f"the session named {name!r} has ended (ended, cancelled or timed out); a "
                "name is one episode: name the next episode's calls with a new id",
                code="session_finished",
                status=409,
            ) from None
        return sid, key


__all__ = ["MODEL_PREFIX", "SESSION_HEADER", "NamedSessions", "session_name"]

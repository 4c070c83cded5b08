"""Train your own agent: open sessions on a ``sessions`` run, talk to them with ``openai``.

::

    from sdk.sessions import SessionGateway

    gateway = SessionGateway.from_folder("runs/my-agent")  # what `rlaas train` wrote
    with gateway.open(group="task-17") as session:     # cancels it if your code raises
        client = session.openai()                      # openai.OpenAI for this session
        answer = client.chat.completions.create(model="policy", messages=[...], tools=[...])
        ...                                            # your agent loop, your tools
        text = client.completions.create(model="policy", prompt="...")  # no chat template
        session.end(reward=1.0)                        # the episode's reward

A run submitted to the service: ``SessionGateway.for_run(api_url, api_key, run_id)``
(the API proxies the session's calls to the worker holding the run).

Sessions of one ``group`` are GRPO's group (the same task, ``rollout.group_size`` of
them). `SessionGateway.open` waits while the run has no free episode (at the server,
then HTTP 429: the run's backpressure) or is not serving yet (503), up to ``wait_s``.
A cancelled session (`Session.cancel`) is not trained on, nor is one left without
`Session.end`: it times out on the server after ``rollout.episode_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from sdk.errors import RlaasError


class SessionGateway:
    """Where sessions of one run are opened: a local run's gateway (``SessionGateway(url,
    token)`` or `from_folder`), or a run of the service (`for_run`: the API's URL)."""

    def __init__(
        self, url: str, token: str, *, timeout_s: float = 120.0, open_path: str = "/v1/sessions"
    ) -> None:
        self.url = url.rstrip("/")
        self._open_url = self.url + open_path
        self._http = httpx.Client(timeout=timeout_s)
        self._token = token

    @classmethod
    def for_run(cls, api_url: str, api_key: str, run_id: str) -> SessionGateway:
        """Sessions of a run submitted to the service (``POST /v1/runs/{id}/sessions``)."""
        return cls(f"{api_url.rstrip('/')}/v1/runs/{run_id}", api_key, open_path="/sessions")

    @classmethod
    def from_folder(cls, out: str | Path, *, wait_s: float = 60.0) -> SessionGateway:
        """The gateway of the ``rlaas train --out`` folder ``out`` (its sessions.json),
        waiting up to ``wait_s`` for the run to start serving."""
        where = Path(out) / "sessions.json"
        deadline = time.monotonic() + wait_s
        while not where.exists():
            if time.monotonic() > deadline:
                raise RlaasError(f"no {where} after {wait_s:.0f} s: is `rlaas train` running?")
            time.sleep(0.2)
        data = json.loads(where.read_text())
        return cls(data["url"], data["token"])

    def open(self, group: str | None = None, *, wait_s: float = 60.0) -> Session:
        """A new session (of ``group``), waiting up to ``wait_s`` for a free episode.

        The server holds the request until an episode is free (up to 20 s a request);
        a 429 or 503 (the run's worker is not serving yet) is retried after its
        Retry-After until ``wait_s`` has passed.
        """
        deadline = time.monotonic() + wait_s
        while True:
            body: dict[str, Any] = {
                "wait_s": round(min(20.0, max(0.0, deadline - time.monotonic())), 3)
            }
            if group is not None:
                body["group"] = group
            answer = self._http.post(
                self._open_url, json=body, headers={"Authorization": f"Bearer {self._token}"}
            )
            if answer.status_code not in (429, 503):
                break
            pause = float(answer.headers.get("Retry-After", "1"))
            if answer.status_code == 429 and body["wait_s"] > 0:
                pause = 0.0  # the server already waited
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
        data = _checked(answer)
        return Session(self._http, data["session_id"], data["base_url"], data["api_key"])

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SessionGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    def __init__(self, http: httpx.Client, session_id: str, base_url: str, api_key: str) -> None:
        self.session_id, self.base_url, self.api_key = session_id, base_url, api_key
        self._http = http
        self.ended = False

    def openai(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client for this session (``pip install openai``)."""
        try:
            from openai import OpenAI
        except ImportError as exc:
            raise RlaasError("Session.openai needs the openai package: pip install openai") from exc
        return OpenAI(base_url=self.base_url, api_key=self.api_key, **options)

    def end(self, reward: float, turn_rewards: list[float] | None = None) -> dict[str, Any]:
        """Report the episode's reward (and, optionally, one per call, summing to it)."""
        body: dict[str, Any] = {"reward": reward}
        if turn_rewards is not None:
            body["turn_rewards"] = turn_rewards
        answer = self._http.post(
            f"{self.base_url}/end", json=body, headers={"Authorization": f"Bearer {self.api_key}"}
        )
        result = _checked(answer)
        self.ended = True
        return result

    def cancel(self) -> None:
        """End the session without a reward: it is left out of training (its group trains
        with the rest, as with a failed episode)."""
        answer = self._http.post(
            f"{self.base_url}/cancel", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        _checked(answer)
        self.ended = True

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # An agent that failed says nothing about the policy: a made-up reward would.
        if kind is not None and not self.ended:
            # The run gone or unreachable: the session times out there anyway.
            with contextlib.suppress(RlaasError, httpx.HTTPError):
                self.cancel()


def _checked(answer: httpx.Response) -> dict[str, Any]:
    if answer.is_success:
        data: dict[str, Any] = answer.json()
        return data
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.text[:200]
    raise RlaasError(f"session gateway answered {answer.status_code}: {message}")


__all__ = ["Session", "SessionGateway"]

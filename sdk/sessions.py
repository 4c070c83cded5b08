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

One client for many sessions (a framework that shares one client between rollouts,
such as verifiers): each call names its session, which its first call opens::

    client = gateway.openai()   # the run's shared URL, with the run's (or tenant's) key
    client.chat.completions.create(..., extra_headers={"X-Session-ID": rollout_id})
    client.responses.create(model=f"session:{rollout_id}", ...)   # or named by model
    gateway.end(rollout_id, reward=1.0)

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
from urllib.parse import quote

import httpx

from sdk.errors import RlaasError


class SessionGateway:
    """Where sessions of one run are opened: a local run's gateway (``SessionGateway(url,
    token)`` or `from_folder`), or a run of the service (`for_run`: the API's URL)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 120.0,
        open_path: str = "/v1/sessions",
        shared_path: str = "/v1/openai",
    ) -> None:
        self.url = url.rstrip("/")
        self._open_url = self.url + open_path
        # One base URL for many sessions, each call naming its own (docs/sessions.md).
        self.shared_url = self.url + shared_path
        self._http = httpx.Client(timeout=timeout_s)
        self._token = token

    @classmethod
    def for_run(cls, api_url: str, api_key: str, run_id: str) -> SessionGateway:
        """Sessions of a run submitted to the service (``POST /v1/runs/{id}/sessions``)."""
        return cls(
            f"{api_url.rstrip('/')}/v1/runs/{run_id}",
            api_key,
            open_path="/sessions",
            shared_path="/openai",
        )

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

    def openai(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client on the run's shared URL: name each call's session
        with the header ``X-Session-ID`` (or ``model="session:<id>"``); its first call
        opens it (group: the header ``X-Session-Group``)."""
        return _openai_client(self.shared_url, self._token, **options)

    def end(
        self, name: str, reward: float, turn_rewards: list[float] | None = None
    ) -> dict[str, Any]:
        """End the session named ``name`` on the shared URL with its reward."""
        body: dict[str, Any] = {"reward": reward}
        if turn_rewards is not None:
            body["turn_rewards"] = turn_rewards
        return _checked(self._http.post(self._named(name, "end"), json=body, headers=self._auth))

    def cancel(self, name: str) -> None:
        """End the session named ``name`` unscored (it is not trained on)."""
        _checked(self._http.post(self._named(name, "cancel"), headers=self._auth))

    @property
    def token(self) -> str:
        """The key of the run's shared URL (the run's gateway token, or the tenant's key)."""
        return self._token

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    def _named(self, name: str, action: str) -> str:
        return f"{self.shared_url}/sessions/{quote(name, safe='')}/{action}"

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
        """An ``openai.OpenAI`` client for this session (``pip install openai``, 1.x to 3.x)."""
        return _openai_client(self.base_url, self.api_key, **options)

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


def _openai_client(base_url: str, api_key: str, **options: Any) -> Any:
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise RlaasError("this needs the openai package: pip install 'rlaas[sessions]'") from exc
    return OpenAI(base_url=base_url, api_key=api_key, **options)


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

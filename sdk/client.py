"""A typed Python client for the rlaas public API.

    client = Client("http://127.0.0.1:8000", api_key)
    run = client.create_run(load_spec("examples/tiny-game-short.yaml"))
    run = client.wait(run.id)
    rewards = client.metrics(run.id, name="reward/mean")

Errors are `ApiError` with the HTTP status and the server's message, which
names the field to change.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from rl_core.spec import JobSpec

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}" + (f" (field: {field})" if field else ""))
        self.status = status
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Run:
    id: str
    status: str
    name: str | None
    current_step: int
    error: str | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=data["id"],
            status=data["status"],
            name=data.get("name"),
            current_step=int(data.get("current_step") or 0),
            error=data.get("error"),
            raw=data,
        )

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class MetricPoint:
    step: int
    name: str
    value: float


class Client:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def create_run(
        self, spec: JobSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> Run:
        body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return Run.from_json(
            self._request("POST", "/v1/runs", json={"spec": body}, headers=headers)
        )

    def get_run(self, run_id: str) -> Run:
        return Run.from_json(self._request("GET", f"/v1/runs/{run_id}"))

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[Run]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        data = self._request("GET", "/v1/runs", params=params)
        return [Run.from_json(item) for item in data["items"]]

    def cancel(self, run_id: str) -> Run:
        return Run.from_json(self._request("POST", f"/v1/runs/{run_id}/cancel"))

    def metrics(
        self, run_id: str, *, name: str | None = None, since_step: int | None = None
    ) -> list[MetricPoint]:
        params: dict[str, Any] = {}
        if name:
            params["name"] = name
        if since_step is not None:
            params["since_step"] = since_step
        data = self._request("GET", f"/v1/runs/{run_id}/metrics", params=params)
        return [MetricPoint(p["step"], p["name"], float(p["value"])) for p in data["points"]]

    def poll(self, run_id: str, *, interval_s: float = 1.0) -> Iterator[Run]:
        """Yield the run every `interval_s` until it reaches a terminal state."""
        while True:
            run = self.get_run(run_id)
            yield run
            if run.done:
                return
            time.sleep(interval_s)

    def wait(self, run_id: str, *, timeout_s: float = 3600.0, interval_s: float = 1.0) -> Run:
        deadline = time.monotonic() + timeout_s
        for run in self.poll(run_id, interval_s=interval_s):
            if run.done:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s:.0f}s")
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {}
            raise ApiError(
                response.status_code, str(error.get("message") or response.text), error.get("field")
            )
        data: dict[str, Any] = response.json()
        return data

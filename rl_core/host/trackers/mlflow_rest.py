"""An MLflow tracking server, through its REST API (``/api/2.0/mlflow/...``) with httpx.

Not the ``mlflow`` client: mlflow-skinny is ~70 MB installed and ~5 s to import on
a worker, and its HTTP retries (seven, backoff up to minutes) are set by process-wide
environment variables; the mirror already retries with its own bounds. The REST calls
used (experiments get-by-name/create, runs search/create/log-batch/update) are MLflow's
documented, versioned API, and the tests run them against a real ``mlflow server``.

Credentials come from the worker's environment, under the names MLflow's own client
reads: ``MLFLOW_TRACKING_TOKEN`` (a bearer token) or ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD`` (basic auth); a spec never holds them (`rl_core.spec`).

The tracking URI is a tenant's choice, so the worker calls it only where its
``RLAAS_ENV_URL_ALLOWLIST`` allows (`rl_core.protocol.addresses`): the name is resolved
and every address checked when the tracker connects, and the client connects to a
checked address with the URL's name as Host and TLS name, never to a second lookup of
the name (a name re-pointed after the check, DNS rebinding, is not followed). A failed
connection resolves and checks again before the next call, trying the next address.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from rl_core.host.trackers.base import Outcome, StepMetrics, TrackerError
from rl_core.protocol.addresses import Allowlist, IPAddress, ip_literal, parse_address

# MLflow's log-batch takes at most 1000 metrics per request.
BATCH_LIMIT = 1000
RUN_TAG = "rlaas.run_id"
_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
# MLflow refuses metric keys outside these characters (the whole batch with them).
_KEY_REFUSED = re.compile(r"[^\w\-. :/]")


class MlflowRest:
    kind = "mlflow"

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment: str,
        run_id: str,
        run_name: str | None = None,
        allowlist: Allowlist | None = None,
        timeout_s: float = 10.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self._experiment = experiment
        self._rlaas_run = run_id
        self._run_name = run_name or run_id
        self._allowlist = allowlist
        self._timeout_s = timeout_s
        self._environ = os.environ if environ is None else environ
        self._client: httpx.Client | None = None
        self._extensions: dict[str, Any] = {}
        self._failed_connections = 0
        self.mlflow_run_id: str | None = None

    def open(self) -> None:
        experiment_id = self._experiment_id()
        self.mlflow_run_id = self._find_run(experiment_id) or self._create_run(experiment_id)

    def log(self, steps: Sequence[StepMetrics]) -> None:
        now_ms = int(time.time() * 1000)
        metrics = [
            {"key": _KEY_REFUSED.sub("_", name), "value": value, "timestamp": now_ms, "step": step}
            for step, values in steps
            for name, value in values.items()
        ]
        for start in range(0, len(metrics), BATCH_LIMIT):
            chunk = metrics[start : start + BATCH_LIMIT]
            self._call("POST", "runs/log-batch", {"run_id": self.mlflow_run_id, "metrics": chunk})

    def close(self, outcome: Outcome) -> None:
        try:
            body = {
                "run_id": self.mlflow_run_id,
                "status": _STATUS[outcome],
                "end_time": int(time.time() * 1000),
            }
            self._call("POST", "runs/update", body)
        finally:
            if self._client is not None:
                self._client.close()
                self._client = None

    # --- the calls ------------------------------------------------------------------

    def _experiment_id(self) -> str:
        found = self._call(
            "GET", "experiments/get-by-name", params={"experiment_name": self._experiment},
            missing_ok=True,
        )  # fmt: skip
        if found is not None:
            return str(found["experiment"]["experiment_id"])
        created = self._call(
            "POST", "experiments/create", {"name": self._experiment}, exists_ok=True
        )
        if created is None:  # another worker created it meanwhile
            return self._experiment_id()
        return str(created["experiment_id"])

    def _find_run(self, experiment_id: str) -> str | None:
        # A resumed attempt continues the MLflow run of the attempt before.
        found = self._call(
            "POST",
            "runs/search",
            {
                "experiment_ids": [experiment_id],
                "filter": f"tags.`{RUN_TAG}` = '{_quoted(self._rlaas_run)}'",
                "max_results": 1,
            },
        )
        runs = (found or {}).get("runs") or []
        return str(runs[0]["info"]["run_id"]) if runs else None

    def _create_run(self, experiment_id: str) -> str:
        created = self._call(
            "POST",
            "runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": self._run_name,
                "start_time": int(time.time() * 1000),
                "tags": [{"key": RUN_TAG, "value": self._rlaas_run}],
            },
        )
        assert created is not None
        return str(created["run"]["info"]["run_id"])

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
        exists_ok: bool = False,
    ) -> dict[str, Any] | None:
        if self._client is None:
            self._connect()
        assert self._client is not None
        try:
            response = self._client.request(
                method, path, json=body, params=params, extensions=self._extensions
            )
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.ConnectError):  # resolve and check again, next address
                self._failed_connections += 1
                self._client.close()
                self._client = None
            raise TrackerError(f"MLflow at {self.tracking_uri}: {exc!r}") from exc
        if response.is_success:
            answer: dict[str, Any] = response.json() if response.content else {}
            return answer
        code = _error_code(response)
        if missing_ok and code == "RESOURCE_DOES_NOT_EXIST":
            return None
        if exists_ok and code == "RESOURCE_ALREADY_EXISTS":
            return None
        transient = response.status_code in (408, 429) or response.status_code >= 500
        raise TrackerError(
            f"MLflow at {self.tracking_uri} answered {path} with {response.status_code} "
            f"{code or ''}: {response.text[:300]}",
            permanent=not transient,
        )

    # --- where and who --------------------------------------------------------------

    def _connect(self) -> None:
        """A client to the server: to an address the allowlist allowed (when there is one),
        with the URL's name as Host and TLS name."""
        address = self._checked_address()
        base, headers, self._extensions = _pinned(self.tracking_uri, address)
        self._client = httpx.Client(
            base_url=f"{base}/api/2.0/mlflow/",
            timeout=self._timeout_s,
            auth=self._auth(),
            headers={**self._headers(), **headers},
            follow_redirects=False,  # a redirect would leave the checked address
        )

    def _checked_address(self) -> IPAddress | None:
        """One of the addresses the URL's host resolves to, all of them allowed; None when
        there is no allowlist (one's own machine: httpx resolves the name itself)."""
        if self._allowlist is None:
            return None
        host = urlsplit(self.tracking_uri).hostname or ""
        why = self._allowlist.host_refusal(host)
        found: list[IPAddress] = []
        if why is None:
            literal = ip_literal(host)
            if literal is not None:
                found = [literal]
            else:
                try:
                    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                except OSError as exc:
                    raise TrackerError(f"MLflow host {host} does not resolve: {exc}") from exc
                found = list(dict.fromkeys(parse_address(str(i[4][0])) for i in infos))
            why = self._allowlist.refusal(host, found)
        if why is not None or not found:
            raise TrackerError(
                f"MLflow tracking_uri refused: {why or 'no address'}", permanent=why is not None
            )
        return found[self._failed_connections % len(found)]

    def _auth(self) -> httpx.BasicAuth | None:
        user = self._environ.get("MLFLOW_TRACKING_USERNAME")
        password = self._environ.get("MLFLOW_TRACKING_PASSWORD")
        return httpx.BasicAuth(user, password) if user and password else None

    def _headers(self) -> dict[str, str]:
        token = self._environ.get("MLFLOW_TRACKING_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}


def _pinned(url: str, address: IPAddress | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` with its host replaced by ``address``, and the Host header and TLS name
    that keep the server seeing the name the URL gives."""
    if address is None:
        return url, {}, {}
    parts = urlsplit(url)
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{host}:{parts.port}" if parts.port else host
    return (
        urlunsplit(parts._replace(netloc=netloc)),
        {"Host": parts.netloc},
        {"sni_hostname": parts.hostname},
    )


def _error_code(response: httpx.Response) -> str | None:
    try:
        code = response.json().get("error_code")
    except ValueError:
        return None
    return str(code) if code else None


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


__all__ = ["MlflowRest"]

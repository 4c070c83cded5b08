"""A typed Python client for the rlaas public API.

    with Client("http://127.0.0.1:8000", api_key) as client:
        run = client.create_run(load_spec("examples/tiny-game-short.yaml"))
        for step in client.iter_metrics(run.id):      # live, over server-sent events
            print(step.step, step.metrics.get("reward/mean"))
        run = client.get_run(run.id)                  # the stream ended: the run is over

Every error is an ``sdk.errors.RlaasError``: ``ApiError`` subclasses carry the
API's status, code, field and message (which says what to change);
``Unreachable`` means no answer came. The live stream reconnects by itself
after a dropped connection and resumes with ``Last-Event-ID``, so no step is
missed or repeated.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from rl_core.spec import JobSpec
from sdk.errors import ApiError, RateLimited, RlaasError, ServerError, Unreachable
from sdk.errors import error_from_response as _error
from sdk.models import (
    TERMINAL,
    Adapter,
    ApiKeyInfo,
    Checkpoint,
    Dataset,
    Environment,
    EnvironmentCheck,
    Inflight,
    MetricPoint,
    MetricsStep,
    Page,
    Run,
    RunEvent,
    StatusChange,
    StreamEvent,
    Timeline,
    Trajectory,
)
from sdk.sse import parse_events

__all__ = ["TERMINAL", "ApiError", "Client", "MetricPoint", "RlaasError", "Run", "Unreachable"]

# The server sends a keep-alive comment every 15 s: a read silent for longer than this
# is a dead connection (a proxy that dropped it without a FIN), so reconnect.
STREAM_READ_TIMEOUT_S = 45.0


class Client:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        unavailable_retry_s: float = 60.0,
    ) -> None:
        # How long a read (GET) answered 503 (the API's database restarting, say) is tried
        # again, as the answer's Retry-After says; 0 raises the first 503 at once.
        self._unavailable_retry_s = unavailable_retry_s
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

    # --- runs ---------------------------------------------------------------------

    def create_run(
        self,
        spec: JobSpec | dict[str, Any],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Submit a run. With ``idempotency_key``, a retry returns the run made the first time."""
        body: dict[str, Any] = {
            "spec": spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
        }
        if name is not None:
            body["name"] = name
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return Run.from_json(self._json("POST", "/v1/runs", json=body, headers=headers))

    def get_run(self, run_id: str) -> Run:
        return Run.from_json(self._json("GET", _run(run_id)))

    def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> list[Run]:
        """One page of runs, newest first (``iter_runs`` walks them all)."""
        return self.runs_page(status=status, limit=limit, cursor=cursor).items

    def runs_page(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[Run]:
        data = self._json(
            "GET", "/v1/runs", params=_params(status=status, limit=limit, cursor=cursor)
        )
        return Page([Run.from_json(r) for r in data["items"]], data.get("next_cursor"))

    def iter_runs(self, *, status: str | None = None, page_size: int = 100) -> Iterator[Run]:
        cursor: str | None = None
        while True:
            page = self.runs_page(status=status, limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel(self, run_id: str) -> Run:
        """Queued runs end now; running ones stop at their next step boundary."""
        return Run.from_json(self._json("POST", f"{_run(run_id)}/cancel"))

    def events(self, run_id: str, *, after: int | None = None) -> list[RunEvent]:
        """The run's status transitions, oldest first (``after``: an event id)."""
        data = self._json("GET", f"{_run(run_id)}/events", params=_params(after=after))
        return [RunEvent.from_json(e) for e in data["items"]]

    def poll(self, run_id: str, *, interval_s: float = 1.0) -> Iterator[Run]:
        """Yield the run every ``interval_s`` until it reaches a terminal state."""
        while True:
            run = self.get_run(run_id)
            yield run
            if run.done:
                return
            time.sleep(interval_s)

    def wait(self, run_id: str, *, timeout_s: float = 3600.0, interval_s: float = 1.0) -> Run:
        """The run once it has ended; ``TimeoutError`` if it has not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for run in self.poll(run_id, interval_s=interval_s):
            if run.done:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {run_id} still {run.status} after {timeout_s:.0f}s; "
                    "wait longer (timeout_s=...) or cancel it"
                )
        raise AssertionError("unreachable: poll() returns only after a terminal run")

    # --- metrics ------------------------------------------------------------------

    def metrics(
        self,
        run_id: str,
        *,
        name: str | None = None,
        since_step: int | None = None,
        until_step: int | None = None,
    ) -> list[MetricPoint]:
        """Stored metric points, by name then step (both bounds inclusive)."""
        params = _params(name=name, since_step=since_step, until_step=until_step)
        data = self._json("GET", f"{_run(run_id)}/metrics", params=params)
        return [MetricPoint(p["step"], p["name"], float(p["value"])) for p in data["points"]]

    def iter_metrics(
        self,
        run_id: str,
        *,
        after_step: int | None = None,
        max_reconnects: int | None = 20,
        reconnect_delay_s: float = 0.5,
    ) -> Iterator[MetricsStep]:
        """Every step's metrics after ``after_step``, live, until the run has ended."""
        for event in self.stream(
            run_id,
            after_step=after_step,
            max_reconnects=max_reconnects,
            reconnect_delay_s=reconnect_delay_s,
        ):
            if isinstance(event, MetricsStep):
                yield event

    def stream(
        self,
        run_id: str,
        *,
        after_step: int | None = None,
        max_reconnects: int | None = 20,
        reconnect_delay_s: float = 0.5,
        on_reconnect: Callable[[int, int | None, BaseException | None], None] | None = None,
    ) -> Iterator[StreamEvent]:
        """The live stream: ``MetricsStep`` per step, ``StatusChange`` on transitions.

        A dropped connection (reset, a 5xx, a read silent past the keep-alives) is
        retried with backoff, resuming after the last step received; more than
        ``max_reconnects`` failures in a row (None: no limit) raise ``Unreachable``.
        Ends when the server closes the stream of a run that has ended.
        ``on_reconnect(failures, last_step, error)`` is told before each new try
        (error None: the server closed the stream of a run still going).
        """
        last = after_step
        failures = 0
        timeout = httpx.Timeout(self._http.timeout.connect, read=STREAM_READ_TIMEOUT_S)
        error: BaseException | None = None
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            ended = False
            try:
                with self._http.stream(
                    "GET", f"{_run(run_id)}/metrics/stream", headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _error(response)
                    for sse in parse_events(response.iter_lines()):
                        failures = 0  # it answered: count failures afresh
                        event = _stream_event(sse.event, sse.data)
                        if isinstance(event, MetricsStep):
                            if last is not None and event.step <= last:
                                continue  # sent again after a reconnect
                            last = event.step
                        if event is not None:
                            yield event
                # A clean end: the run is over and drained, or the server went away
                # (a restart, a proxy's idle cut). Only the run's state can tell which.
                ended = self.get_run(run_id).done
                error = None
            except RateLimited as exc:
                # Over the tenant's request rate: wait as told; not a failure of the stream.
                error = exc
                time.sleep(exc.retry_after_s or 1.0)
            except (httpx.TransportError, ServerError, Unreachable) as exc:
                error = exc
                failures += 1
                if max_reconnects is not None and failures > max_reconnects:
                    raise Unreachable(
                        f"the metrics stream of {run_id} failed {failures} times in a row "
                        f"(last: {exc!r}); is the control plane at {self._http.base_url} up?"
                    ) from exc
            if ended:
                return
            if on_reconnect is not None:
                on_reconnect(failures, last, error)
            time.sleep(min(reconnect_delay_s * 2 ** max(failures - 1, 0), 10.0))

    # --- results ------------------------------------------------------------------

    def timeline(
        self,
        run_id: str,
        *,
        start_us: int | None = None,
        end_us: int | None = None,
        limit: int | None = None,
    ) -> Timeline:
        """Stage spans from ``start_us`` on (wall-clock microseconds), oldest first."""
        params = _params(start_us=start_us, end_us=end_us, limit=limit)
        return Timeline.from_json(self._json("GET", f"{_run(run_id)}/timeline", params=params))

    def trajectories(
        self,
        run_id: str,
        *,
        step: int | None = None,
        limit: int = 20,
        cursor: str | None = None,
    ) -> Page[Trajectory]:
        """One page of sampled trajectories (by step, oldest first); ``step`` filters."""
        params = _params(step=step, limit=limit, cursor=cursor)
        data = self._json("GET", f"{_run(run_id)}/trajectories", params=params)
        return Page([Trajectory.from_json(t) for t in data["items"]], data.get("next_cursor"))

    def iter_trajectories(
        self, run_id: str, *, step: int | None = None, page_size: int = 100
    ) -> Iterator[Trajectory]:
        cursor: str | None = None
        while True:
            page = self.trajectories(run_id, step=step, limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def checkpoints(self, run_id: str) -> list[Checkpoint]:
        data = self._json("GET", f"{_run(run_id)}/checkpoints")
        return [Checkpoint.from_json(c) for c in data["items"]]

    def download_checkpoint(
        self,
        run_id: str,
        step: int | None = None,
        *,
        format: str = "hf",
        out: str | Path | None = None,
    ) -> Path:
        """Download a checkpoint (the newest when ``step`` is None) into the folder ``out``
        (default ``./<run>-step-<N>-<format>``, which must not hold files yet); returns it.

        ``format="hf"``: the model, any LoRA merged (config.json, model.safetensors, the
        tokenizer files), for ``transformers.AutoModelForCausalLM.from_pretrained(out)``.
        ``format="peft"``: a LoRA run's adapter, for ``peft.PeftModel.from_pretrained``.
        """
        if step is None:
            steps = [c.step for c in self.checkpoints(run_id)]
            if not steps:
                raise RlaasError(
                    f"run {run_id} has no checkpoint yet; wait for its first checkpoint "
                    "(train.checkpoint_interval steps) or its end"
                )
            step = max(steps)
        target = Path(out) if out is not None else Path(f"{run_id}-step-{step}-{format}")
        path = f"{_run(run_id)}/checkpoints/{int(step)}/export"
        return self._download(path, target, params={"format": format})

    def delete_artifacts(self, run_id: str) -> int:
        """Delete a finished run's checkpoints and exports from storage (download what you
        keep first); returns the bytes freed from the tenant's ``artifact_bytes`` quota."""
        return int(self._json("DELETE", f"{_run(run_id)}/artifacts")["freed_bytes"])

    def download_tensorboard(self, run_id: str, *, out: str | Path | None = None) -> Path:
        """Download the run's TensorBoard event files (its spec's ``trackers`` names
        ``{kind: tensorboard}``) into the folder ``out`` (default ``./<run>-tensorboard``,
        which must not hold files yet); returns it, for ``tensorboard --logdir out``."""
        target = Path(out) if out is not None else Path(f"{run_id}-tensorboard")
        return self._download(f"{_run(run_id)}/trackers/tensorboard", target, params={})

    def _download(self, path: str, target: Path, *, params: dict[str, str]) -> Path:
        """A tar the API streams, unpacked into ``target`` (`sdk.downloads.unpack_export`)."""
        from sdk.downloads import unpack_export

        # A model is hundreds of MB: no limit on the whole read, only on each silence.
        timeout = httpx.Timeout(self._http.timeout.connect, read=STREAM_READ_TIMEOUT_S)
        try:
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                return unpack_export(response.iter_bytes(), target)
        except httpx.TransportError as exc:
            raise Unreachable(f"GET {path}: the download broke off ({exc!r}); try again") from exc

    def inflight(self, run_id: str) -> Inflight:
        """What the run is waiting on: the episodes in flight, their stage, for how long."""
        return Inflight.from_json(self._json("GET", f"{_run(run_id)}/inflight"))

    def request_profile(self, run_id: str, steps: int) -> int:
        """Ask the worker to profile the next ``steps`` steps; returns the steps granted."""
        data = self._json("POST", f"{_run(run_id)}/profile", json={"steps": steps})
        return int(data["requested_steps"])

    # --- environments ----------------------------------------------------------------

    def register_environment(
        self,
        name: str,
        url: str,
        secret: str,
        *,
        timeout_s: float = 30.0,
        max_concurrency: int = 16,
    ) -> Environment:
        """Register a webhook environment. Its ``id`` goes in a spec's environment.name.

        ``secret`` (16+ characters) signs every request to ``url``; it is stored
        encrypted and never returned.
        """
        body = {
            "name": name,
            "url": url,
            "secret": secret,
            "timeout_s": timeout_s,
            "max_concurrency": max_concurrency,
        }
        return Environment.from_json(self._json("POST", "/v1/environments", json=body))

    def list_environments(self) -> list[Environment]:
        data = self._json("GET", "/v1/environments")
        return [Environment.from_json(e) for e in data["items"]]

    def get_environment(self, environment_id: str) -> Environment:
        return Environment.from_json(self._json("GET", _env(environment_id)))

    def delete_environment(self, environment_id: str) -> None:
        self._request("DELETE", _env(environment_id))

    def check_environment(self, environment_id: str) -> EnvironmentCheck:
        """Call the webhook once (reset, close), before a run spends compute on it."""
        return EnvironmentCheck.from_json(self._json("POST", f"{_env(environment_id)}/check"))

    # --- datasets -------------------------------------------------------------------

    def upload_dataset(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        required: Sequence[str] = (),
        timeout_s: float = 600.0,
    ) -> Dataset:
        """Upload a JSONL file (one JSON object a line) or a Parquet file (``.parquet``,
        ``.pq``: stored as the JSONL of its rows), streamed from disk.

        ``name`` defaults to the file's name without its suffix; a name already used
        replaces that dataset's content (runs already submitted keep theirs).
        ``required``: fields every row must have (a row without one is refused, by line
        or, in a Parquet file, by row).
        """
        path = Path(path)
        parquet = path.suffix.lower() in (".parquet", ".pq")
        content_type = "application/vnd.apache.parquet" if parquet else "application/x-ndjson"
        params = _params(name=name or path.stem, required=",".join(required) or None)

        def chunks() -> Iterator[bytes]:
            with path.open("rb") as f:
                while chunk := f.read(1 << 16):
                    yield chunk

        response = self._request(
            "POST",
            "/v1/datasets",
            params=params,
            content=chunks(),
            headers={"Content-Type": content_type},
            timeout=timeout_s,
        )
        return Dataset.from_json(response.json())

    def list_datasets(self) -> list[Dataset]:
        return [Dataset.from_json(d) for d in self._json("GET", "/v1/datasets")["items"]]

    def get_dataset(self, dataset_id: str) -> Dataset:
        return Dataset.from_json(self._json("GET", _dataset(dataset_id)))

    def delete_dataset(self, dataset_id: str) -> None:
        """Refused (409, naming them) while a queued or running run uses it."""
        self._request("DELETE", _dataset(dataset_id))

    # --- adapters -------------------------------------------------------------------

    def upload_adapter(
        self, folder: str | Path, *, name: str | None = None, timeout_s: float = 600.0
    ) -> Adapter:
        """Upload a PEFT LoRA adapter folder (``adapter_config.json`` and
        ``adapter_model.safetensors``, as PEFT's ``save_pretrained`` or ``rlaas download
        --format peft`` leave them) to start runs from: ``model.lora.init_from:
        adapter:<id>``. ``name`` defaults to the folder's name. The two files go up as a
        tar, streamed from a temporary file."""
        import tarfile
        import tempfile

        folder = Path(folder)
        files = [folder / "adapter_config.json", folder / "adapter_model.safetensors"]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise RlaasError(f"{folder} has no {' and no '.join(missing)}: not a PEFT adapter")
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for file in files:
                    tar.add(file, arcname=file.name)
            archive.seek(0)

            def chunks() -> Iterator[bytes]:
                while chunk := archive.read(1 << 16):
                    yield chunk

            response = self._request(
                "POST",
                "/v1/adapters",
                params=_params(name=name or folder.resolve().name),
                content=chunks(),
                headers={"Content-Type": "application/x-tar"},
                timeout=timeout_s,
            )
        return Adapter.from_json(response.json())

    def list_adapters(self) -> list[Adapter]:
        return [Adapter.from_json(a) for a in self._json("GET", "/v1/adapters")["items"]]

    def delete_adapter(self, adapter_id: str) -> None:
        """Refused (409, naming them) while a queued or running run starts from it."""
        self._request("DELETE", f"/v1/adapters/{_segment(adapter_id, 'adapter id')}")

    # --- API keys -------------------------------------------------------------------

    def list_keys(self) -> list[ApiKeyInfo]:
        return [ApiKeyInfo.from_json(k) for k in self._json("GET", "/v1/keys")["items"]]

    def create_key(self) -> ApiKeyInfo:
        """A new key of your tenant; its secret (``.key``) is shown this once."""
        return ApiKeyInfo.from_json(self._json("POST", "/v1/keys"))

    def revoke_key(self, key_id: str) -> ApiKeyInfo:
        """Revoke a key (not your last active one: create its replacement first)."""
        path = f"/v1/keys/{_segment(key_id, 'key id')}"
        return ApiKeyInfo.from_json(self._json("DELETE", path))

    # --- plumbing -------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        deadline = time.monotonic() + self._unavailable_retry_s
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise Unreachable(
                    f"{method} {path}: no answer from {self._http.base_url} ({exc!r})"
                ) from exc
            wait_s = _retry_after_s(response)
            # Reads only: a write answered 503 may or may not have happened.
            if response.status_code != 503 or method != "GET" or wait_s is None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(wait_s, left))
        if response.status_code >= 400:
            raise _error(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = self._request(method, path, **kwargs).json()
        return data


def _retry_after_s(response: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds (the API sends whole seconds), if it has one."""
    try:
        return max(float(response.headers["Retry-After"]), 0.1)
    except (KeyError, ValueError):
        return None


def _stream_event(kind: str, data: str) -> StreamEvent | None:
    body = json.loads(data)
    if kind == "metrics":
        metrics = {str(k): float(v) for k, v in body["metrics"].items()}
        return MetricsStep(step=int(body["step"]), metrics=metrics)
    if kind == "status":
        return StatusChange(status=str(body["status"]))
    return None  # a kind this SDK does not know yet: skipped, not fatal


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _run(run_id: str) -> str:
    return f"/v1/runs/{_segment(run_id, 'run id')}"


def _env(environment_id: str) -> str:
    return f"/v1/environments/{_segment(environment_id, 'environment id')}"


def _dataset(dataset_id: str) -> str:
    return f"/v1/datasets/{_segment(dataset_id, 'dataset id')}"


def _segment(value: str, what: str) -> str:
    # An id is one path segment; anything else would address another route.
    if not value or "/" in value or value in (".", ".."):
        raise RlaasError(f"{what} {value!r} is not an id; pass the id the API returned")
    return value

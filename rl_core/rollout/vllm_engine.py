"""`RolloutEngine` over a vLLM server, by HTTP: token ids in, token ids and logprobs out.

vLLM runs in its own process and venv (`rl_core.rollout.vllm_server`); this module imports
neither JAX nor vllm. Each prompt is one ``POST /inference/v1/generate`` request (its own
seed and token budget); vLLM batches the requests in flight itself, so `generate` only
bounds how many are in flight. No text crosses the wire: the server runs with
``--skip-tokenizer-init`` and answers with token ids, the logprob of each sampled token
under the distribution it was sampled from (``--logprobs-mode processed_logprobs``: after
temperature, top-k and top-p, what the trainer's importance ratio needs), and the weight
version that sampled each span of tokens.

A cancelled `generate` (an episode cancelled or timed out) closes its requests'
connections; vLLM aborts a request whose client disconnects, so the server stops spending
compute on it.

`update_weights` writes the new weights as HF safetensors (``write_weights``, supplied by
the caller because that needs JAX), then, through vLLM's dev-mode routes: ``/pause``
(``mode=wait``: requests in flight finish with the old weights, new ones queue), reload in
place (``/collective_rpc`` ``reload_weights``), label the weights with the version
(``/update_weight_version``), drop the prefix cache, ``/resume``. The pause is measured
(`WeightUpdate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from rl_core.errors import RolloutError
from rl_core.rollout.base import Completion, SamplingParams, token_limits

__all__ = ["VllmEngine", "WeightUpdate"]

WeightsWriter = Callable[[Any, Path], Any]  # (params, folder): writes folder/model.safetensors


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """One `update_weights`, in seconds: writing the file, and the server paused."""

    version: int
    write_s: float
    pause_s: float  # from /pause called to /resume answered: no new request is served
    total_s: float


class VllmEngine:
    """Drives the vLLM server at ``base_url``; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        stop_ids: Sequence[int],
        write_weights: WeightsWriter | None = None,
        policy_version: int = 0,
        max_in_flight: int = 256,
        request_timeout_s: float = 600.0,
        admin_timeout_s: float = 300.0,
        weights_dir: Path | None = None,
        server_log: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: an in-memory server
    ) -> None:
        self._transport = transport
        self.base_url = base_url.rstrip("/")
        self.server_log = server_log  # named in errors: where a crashed server says why
        self.stop_ids = tuple(stop_ids)
        self._write_weights = write_weights
        self._version = policy_version
        self._initial_version = policy_version
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.admin_timeout_s = admin_timeout_s
        # Weight files go to RAM where there is a tmpfs: vLLM reads them once. The folder
        # is made at the first update (an engine that never updates leaves nothing).
        self._weights_dir = weights_dir or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
        self._weights_root: Path | None = None
        self._current_weights: Path | None = None
        self._update_lock = threading.Lock()
        self.updates: list[WeightUpdate] = []
        # An httpx.AsyncClient belongs to the event loop it was first used on.
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def policy_version(self) -> int:
        return self._version

    # --- generation --------------------------------------------------------------

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
    ) -> list[Completion]:
        limits = token_limits(prompts, max_new_tokens, seeds)
        client, slots = self._session()
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._one(client, slots, list(p), m, sampling, s))
                    for p, m, s in zip(prompts, limits, seeds, strict=True)
                ]
        except ExceptionGroup as group:
            # One failed request fails the call (the others are cancelled, hence aborted);
            # the caller sees its error as the JAX engine's callers do, not a group, with
            # its own cause (the HTTP error) kept.
            leaf = _first_leaf(group)
            raise leaf from leaf.__cause__
        return [t.result() for t in tasks]

    async def _one(
        self,
        client: httpx.AsyncClient,
        slots: asyncio.Semaphore,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
    ) -> Completion:
        greedy = sampling.temperature == 0
        body = {
            "request_id": f"rlaas-{uuid.uuid4().hex}",
            "token_ids": prompt,
            "sampling_params": {
                "max_tokens": max_new_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,  # 0: no top-k filter, as in vLLM
                "seed": seed,
                "logprobs": 0,  # the sampled token's own logprob only
                "stop_token_ids": list(self.stop_ids),
                # Only our stop ids end a sequence, as in the JAX engine; the model's
                # config may name an eos that the run does not stop on.
                "ignore_eos": True,
                "detokenize": False,
            },
        }
        async with slots:
            # Cancelling this await (episode cancelled or timed out) closes the connection;
            # vLLM aborts the request on the disconnect.
            try:
                try:
                    response = await client.post("/inference/v1/generate", json=body)
                except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
                    # A pooled connection the server closed as we sent on it (its idle
                    # timeout raced ours; seen under load). Whatever the server got of
                    # the request was aborted with the connection: sent again, once.
                    body["request_id"] = f"rlaas-{uuid.uuid4().hex}"
                    response = await client.post("/inference/v1/generate", json=body)
            except httpx.TimeoutException as e:
                raise RolloutError(
                    f"vLLM did not answer a generate request within {self.request_timeout_s:.0f} s "
                    f"({self.base_url}); raise request_timeout_s or lower the load"
                ) from e
            except httpx.TransportError as e:
                raise RolloutError(
                    f"vLLM at {self.base_url} is unreachable ({type(e).__name__}: {e})"
                    + self._log_hint()
                ) from e
        if response.status_code != 200:
            raise RolloutError(
                f"vLLM refused a generate request ({response.status_code}): "
                f"{response.text[:500]}" + self._log_hint()
            )
        return self._completion(response.json(), greedy=greedy)

    def _completion(self, data: dict[str, Any], *, greedy: bool) -> Completion:
        choice = data["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(tokens) or any(
            int(c["token_id"]) != t for c, t in zip(content, tokens, strict=True)
        ):
            raise RolloutError("vLLM's logprobs do not line up with its token ids")
        # The Completion contract: 0 for greedy decoding, a point mass (vLLM reports the
        # raw logprob there).
        logprobs = [0.0 if greedy else float(c["logprob"]) for c in content]
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise RolloutError(f"vLLM ended a request with finish_reason={reason!r}")
        finish: Literal["stop", "length"] = "stop" if reason == "stop" else "length"
        return Completion(
            tokens=tokens,
            logprobs=logprobs,
            finish_reason=finish,
            policy_version=self._first_version(choice.get("weight_versions")),
        )

    def _log_hint(self) -> str:
        return f"; the server's log: {self.server_log}" if self.server_log else ""

    def _first_version(self, spans: list[dict[str, Any]] | None) -> int:
        """The version that sampled the first token (as the JAX engine reports it).

        vLLM labels weights "default" until the first `update_weights`.
        """
        if not spans:
            return self._version
        label = str(spans[0]["version"])
        return int(label) if label.lstrip("-").isdigit() else self._initial_version

    async def score(self, tokens: Sequence[int]) -> list[float]:
        """Log-probabilities of ``tokens[1:]``, each given the tokens before it ([T] -> [T-1]).

        Under the served weights and no sampling filter: what checks that the server
        holds the weights the trainer published (a stale server scores as the old ones).
        """
        if len(tokens) < 2:
            raise RolloutError("score needs at least two tokens")
        client, slots = self._session()
        body = {
            "token_ids": list(tokens),
            "sampling_params": {
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "ignore_eos": True,
                "detokenize": False,
            },
        }
        async with slots:
            response = await client.post("/inference/v1/generate", json=body)
        if response.status_code != 200:
            raise RolloutError(f"vLLM refused a score request: {response.text[:500]}")
        rows = response.json()["prompt_logprobs"][1:]
        return [float(row[str(t)]["logprob"]) for row, t in zip(rows, tokens[1:], strict=True)]

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                transport=self._transport,
                timeout=httpx.Timeout(self.request_timeout_s, connect=10.0),
                limits=httpx.Limits(
                    max_connections=self.max_in_flight,
                    max_keepalive_connections=self.max_in_flight,
                    # Below vLLM's own idle timeout (5 s unless VLLM_HTTP_TIMEOUT_KEEP_ALIVE
                    # says otherwise): we drop an idle connection before the server does.
                    keepalive_expiry=2.0,
                ),
            )
            self._client_loop = loop
            self._slots = asyncio.Semaphore(self.max_in_flight)
        assert self._slots is not None
        return self._client, self._slots

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[VllmEngine]:
        """Closes this loop's HTTP connections when the block ends."""
        try:
            yield self
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    # --- weights ------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        """Publish ``params`` as ``version``; blocks until the server samples with them.

        Called from the trainer's thread, not the event loop: the requests in flight
        are drained by the server while this waits.
        """
        if self._write_weights is None:
            raise RolloutError(
                "this VllmEngine has no write_weights; give it one to update the served weights"
            )
        with self._update_lock:
            started = time.perf_counter()
            if self._weights_root is None:
                self._weights_root = Path(
                    tempfile.mkdtemp(prefix="rlaas-vllm-weights-", dir=self._weights_dir)
                )
            folder = self._weights_root / f"v{version}-{uuid.uuid4().hex[:8]}"
            self._write_weights(params, folder)
            written = time.perf_counter()
            with httpx.Client(base_url=self.base_url, timeout=self.admin_timeout_s) as admin:
                self._admin(admin, "/pause", params={"mode": "wait"})
                paused = time.perf_counter()
                self._admin(
                    admin,
                    "/collective_rpc",
                    json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                )
                self._admin(admin, "/update_weight_version", json={"new_version": str(version)})
                self._admin(admin, "/reset_prefix_cache")
                self._admin(admin, "/resume")
                resumed = time.perf_counter()
            previous, self._current_weights = self._current_weights, folder
            self._version = version
            if previous is not None:
                shutil.rmtree(previous, ignore_errors=True)
            self.updates.append(
                WeightUpdate(
                    version=version,
                    write_s=written - started,
                    pause_s=resumed - paused,
                    total_s=resumed - started,
                )
            )

    def _admin(self, client: httpx.Client, path: str, **kwargs: Any) -> None:
        try:
            response = client.post(path, **kwargs)
        except httpx.HTTPError as e:
            raise RolloutError(
                f"vLLM at {self.base_url}: {path} failed ({type(e).__name__}: {e})"
                + self._log_hint()
            ) from e
        if response.status_code == 404:
            raise RolloutError(
                f"vLLM at {self.base_url} has no {path}; start it with VLLM_SERVER_DEV_MODE=1 "
                "(rlaas does when it starts the server)"
            )
        if response.status_code != 200 or '"success":false' in response.text.replace(" ", ""):
            raise RolloutError(
                f"vLLM at {self.base_url}: {path} answered {response.status_code}: "
                f"{response.text[:500]}"
            )

    def close(self) -> None:
        """Removes the weight files (the HTTP client is closed by `aclose`/`serving`).

        Waits for an update in progress: its files would otherwise outlive the engine.
        """
        with self._update_lock:
            root, self._weights_root = self._weights_root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first

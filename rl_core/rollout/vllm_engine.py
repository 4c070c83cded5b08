"""`RolloutEngine` over a vLLM server, by HTTP: token ids in, token ids and logprobs out.

vLLM runs in its own process and venv (`rl_core.rollout.vllm_server`); this module imports
neither JAX nor vllm. Each prompt is one ``POST /inference/v1/generate`` request (its own
seed and token budget); vLLM batches the requests in flight itself, so `generate` only
bounds how many are in flight. No text crosses the wire: the server runs with
``--skip-tokenizer-init`` and answers with token ids, the logprob of each sampled token
under the distribution it was sampled from (``--logprobs-mode processed_logprobs``: after
temperature, top-k and top-p, what the trainer's importance ratio needs), and the weight
version that sampled each span of tokens.

What a client asks for goes along per request: OpenAI's penalties (vLLM's definitions are
OpenAI's: counts of the tokens generated so far), ``logprobs`` for the top alternatives,
and a grammar as ``structured_outputs.grammar`` (llguidance's Lark, compiled by vLLM's
``guidance`` backend; the server needs the model's tokenizer for it, `VllmServer`). vLLM
applies the grammar's mask to the logits before the sampler, so the processed logprobs it
returns are those of the masked distribution, as the JAX engine's are.

A cancelled `generate` (an episode cancelled or timed out) closes its requests'
connections; vLLM aborts a request whose client disconnects, so the server stops spending
compute on it.

`update_weights` writes the new weights as HF safetensors (``write_weights``, supplied by
the caller because that needs JAX), then, through vLLM's dev-mode routes: ``/pause``
(``mode=wait``: requests in flight finish with the old weights, new ones queue), reload in
place (``/collective_rpc`` ``reload_weights``), label the weights with the version
(``/update_weight_version``), drop the prefix cache, ``/resume``. The pause is measured
(`WeightUpdate`) and recorded as the ``engine_paused`` stage.

After every update the server scores a fixed probe sequence (``prompt_logprobs``) and
the engine compares it with the trainer's own logprobs of the same tokens under the
published weights (`WeightCheck`): a server still on old weights (vLLM skipped a tensor),
or one serving another model, fails the run with the mismatch instead of training on
wrong logprobs.

A server that stops answering is recovered before anything fails: one this engine owns
(`VllmServer`) and that exited is started again; one at a user's URL is waited for. Either
way the current weights are pushed again and checked, then the failed requests are sent
again. An owned server that exits more than ``max_restarts`` times, a request that fails
``max_request_recoveries`` times, or a server that stays away longer than
``reconnect_timeout_s`` fails the run with the reason.

In a fleet of servers (`rl_core.rollout.fleet`) an engine does not recover in place
(``recover_in_place=False``): a request or an update that finds its server gone raises
`EngineUnavailable` at once, the fleet sends the request to another server, and brings
this one back with `recover` (restart, push the fleet's newest weights, check them) off
the run's path. A fleet writes each update's weights once (`prepare`) and has every
server load them (`publish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
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
from rl_core.host.telemetry import SpanRecorder, now_us
from rl_core.rollout.base import (
    Completion,
    Grammar,
    GrammarError,
    SamplingParams,
    token_limits,
)
from rl_core.rollout.vllm_server import VllmServer

__all__ = ["EngineUnavailable", "PreparedWeights", "VllmEngine", "WeightCheck", "WeightUpdate"]

log = logging.getLogger(__name__)

WeightsWriter = Callable[[Any, Path], Any]  # (params, folder): writes folder/model.safetensors
# (params, tokens [T]) -> log p(tokens[t] | tokens[:t]) for t >= 1 [T-1], computed by the trainer
Scorer = Callable[[Any, Sequence[int]], Sequence[float]]
MAX_TOP_LOGPROBS = 20  # OpenAI's cap; the server is started with --max-logprobs 21
_VLLM_NO_LOGPROB = -9999.0  # what vLLM's token routes send for -inf
# Transport failures after which the server may be down (a timeout is the load, not the server).
_DOWN = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


@dataclasses.dataclass(frozen=True)
class WeightCheck:
    """The probe that proves which weights a server holds.

    After every update (and every recovery) the server scores ``tokens`` and `scorer` gives
    the trainer's logprobs of the same tokens under the weights just published; more than
    ``tolerance`` apart anywhere fails the update. Both sides compute in float32 (measured:
    under 1e-6 on the test models; a server on the step before's weights was 0.5 off).
    """

    tokens: tuple[int, ...]
    scorer: Scorer
    tolerance: float = 1e-3

    @staticmethod
    def probe(vocab_size: int, length: int = 32) -> tuple[int, ...]:
        """A fixed token sequence spread over the vocabulary (no special meaning needed)."""
        return tuple((17 + 7919 * i) % vocab_size for i in range(length))


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """One `update_weights`, in seconds: writing the file, the server paused, and all of it
    (``total_s`` also holds the drain of the requests in flight and the probe check)."""

    version: int
    write_s: float
    # From the server paused (``mode=wait``: after the requests in flight drained, served
    # with the old weights) to /resume answered: the server serves nothing.
    pause_s: float
    total_s: float
    check_max_dlogprob: float | None = None  # the probe's max |Δ logprob|; None: no check


class VllmEngine:
    """Drives the vLLM server at ``base_url`` (or ``server``'s); see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        stop_ids: Sequence[int],
        write_weights: WeightsWriter | None = None,
        check: WeightCheck | None = None,
        server: VllmServer | None = None,  # owned: restarted when it exits
        recorder: SpanRecorder | None = None,
        policy_version: int = 0,
        max_in_flight: int = 256,
        request_timeout_s: float = 600.0,
        admin_timeout_s: float = 300.0,
        reconnect_timeout_s: float = 60.0,
        max_restarts: int = 3,  # of an owned server that exited, per run
        max_request_recoveries: int = 3,  # recoveries one request may wait for
        weights_dir: Path | None = None,
        server_log: str | None = None,
        name: str | None = None,  # what errors call it; default "vLLM at <base_url>"
        transport: httpx.AsyncBaseTransport | None = None,  # tests: an in-memory server
        admin_transport: httpx.BaseTransport | None = None,  # the same, for blocking calls
        recover_in_place: bool = True,  # False in a fleet: raise EngineUnavailable instead
    ) -> None:
        self.recover_in_place = recover_in_place
        self._transport = transport
        self._admin_transport = admin_transport
        self.base_url = (server.url if server is not None else base_url).rstrip("/")
        self.server = server
        self.server_log = server_log  # named in errors: where a crashed server says why
        # A server rlaas started is named as the run knows it ("rollout server 0 of 2"),
        # not by the loopback port it happened to get; a user's server by its URL.
        self.name = name or f"vLLM at {self.base_url}"
        self._log_name = self.name if name is None else f"{name} ({self.base_url})"  # operators
        self.stop_ids = tuple(stop_ids)
        self._write_weights = write_weights
        self._check = check
        self._expected: list[float] | None = None  # the probe's logprobs under `_version`
        self._recorder = recorder
        self._version = policy_version
        self._initial_version = policy_version
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.admin_timeout_s = admin_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.max_restarts = max_restarts
        self.max_request_recoveries = max_request_recoveries
        self.restarts = 0
        # Weight files go to RAM where there is a tmpfs: vLLM reads them once. The folder
        # is made at the first update (an engine that never updates leaves nothing).
        self._weights_dir = weights_dir or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
        self._weights_root: Path | None = None
        self._current_weights: Path | None = None
        self._owned_current = True  # whether `_current_weights` is this engine's to delete
        self._root_lock = threading.Lock()
        # Held by an update and by a recovery (which may push weights): one at a time.
        self._update_lock = threading.RLock()
        self.updates: list[WeightUpdate] = []
        self.recoveries: list[str] = []  # why each recovery happened
        self._epoch = 0  # +1 per recovery: a request that failed before it retries at once
        # An httpx.AsyncClient belongs to the event loop it was first used on, and to a URL.
        self._client: httpx.AsyncClient | None = None
        self._client_key: tuple[asyncio.AbstractEventLoop, str] | None = None
        self._retired: list[httpx.AsyncClient] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._recovering: asyncio.Lock | None = None

    @property
    def policy_version(self) -> int:
        return self._version

    def connect(self, *, max_context: int) -> None:
        """Check a server this engine did not start, before the run relies on it: that it
        answers, serves a model with room for ``max_context`` tokens, and generates from
        token ids (``--enable-scale-out``)."""
        try:
            with httpx.Client(
                base_url=self.base_url, timeout=10.0, transport=self._admin_transport
            ) as client:
                models = client.get("/v1/models")
                probe = client.post(
                    "/inference/v1/generate",
                    json={"token_ids": [0], "sampling_params": {"max_tokens": 1}},
                )
        except httpx.HTTPError as e:
            raise RolloutError(
                f"no vLLM server answers at {self.base_url} (rollout.vllm_url): "
                f"{type(e).__name__}; start it, or leave vllm_url out and rlaas starts one"
            ) from e
        if models.status_code != 200:
            raise RolloutError(
                f"vLLM at {self.base_url} answered /v1/models with {models.status_code}; "
                "rlaas needs a server without --api-key, on a private address"
            )
        served = models.json().get("data") or []
        if not served:
            raise RolloutError(f"vLLM at {self.base_url} serves no model")
        max_len = served[0].get("max_model_len")
        if isinstance(max_len, int) and max_len < max_context:
            raise RolloutError(
                f"vLLM at {self.base_url} serves {served[0].get('id')!r} with max_model_len "
                f"{max_len}, below the run's agent.max_context {max_context}; restart it with "
                f"--max-model-len {max_context} or lower max_context"
            )
        if probe.status_code == 404:
            raise RolloutError(
                f"vLLM at {self.base_url} has no /inference/v1/generate (token ids in and out); "
                "start it with --enable-scale-out --skip-tokenizer-init and VLLM_SERVER_DEV_MODE=1"
            )
        if probe.status_code != 200:
            raise RolloutError(
                f"vLLM at {self.base_url} cannot generate ({probe.status_code}): {probe.text[:300]}"
            )

    # --- generation --------------------------------------------------------------

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        limits = token_limits(prompts, max_new_tokens, seeds)
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise RolloutError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
        if grammars is not None and len(grammars) != len(prompts):
            raise RolloutError(f"{len(grammars)} grammars for {len(prompts)} prompts")
        each = list(grammars) if grammars is not None else [None] * len(prompts)
        slots = self._loop_state()
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._one(slots, list(p), m, sampling, s, g, top_logprobs))
                    for p, m, s, g in zip(prompts, limits, seeds, each, strict=True)
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
        slots: asyncio.Semaphore,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
        grammar: Grammar | None = None,
        top_logprobs: int = 0,
    ) -> Completion:
        greedy = sampling.temperature == 0
        params: dict[str, Any] = {
            "max_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # 0: no top-k filter, as in vLLM
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
            "seed": seed,
            # 0: the sampled token's own logprob only. vLLM lists the sampled token first,
            # then the others by rank, cut at the number asked: k + 1 hold the top k.
            "logprobs": top_logprobs + 1 if top_logprobs else 0,
            "stop_token_ids": list(self.stop_ids),
            # Only our stop ids end a sequence, as in the JAX engine; the model's
            # config may name an eos that the run does not stop on.
            "ignore_eos": True,
            "detokenize": False,
        }
        if grammar is not None:
            params["structured_outputs"] = {"grammar": grammar.lark}
        body = {"token_ids": prompt, "sampling_params": params}
        async with slots:
            response = await self._post("/inference/v1/generate", body)
        if response.status_code == 400 and grammar is not None:
            if "tokenizer" in response.text:
                raise RolloutError(
                    f"{self.name} does not serve grammars: it runs "
                    "without the model's tokenizer (--skip-tokenizer-init; serve a model "
                    f"folder with tokenizer.json): {response.text[:300]}"
                )
            raise GrammarError(f"the grammar does not compile: {response.text[:500]}")
        if response.status_code != 200:
            raise RolloutError(
                f"vLLM refused a generate request ({response.status_code}): "
                f"{response.text[:500]}" + self._log_hint()
            )
        return self._completion(response.json(), greedy=greedy, top_logprobs=top_logprobs)

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST with the engine's recovery: a server that went away is brought back first.

        Cancelling this await (episode cancelled or timed out) closes the connection;
        vLLM aborts the request on the disconnect.
        """
        first, recovered = True, 0
        while True:
            epoch = self._epoch
            body["request_id"] = f"rlaas-{uuid.uuid4().hex}"  # never reused, even on a resend
            try:
                response = await self._client_now().post(path, json=body)
            except httpx.TimeoutException as e:
                raise RolloutError(
                    f"vLLM did not answer a request within {self.request_timeout_s:.0f} s "
                    f"({self.name}); raise request_timeout_s or lower the load"
                ) from e
            except _DOWN as e:
                if first and not isinstance(e, httpx.ConnectError):
                    # A pooled connection the server closed as we sent on it (its idle
                    # timeout raced ours; seen under load): whatever the server got was
                    # aborted with the connection. Sent again at once.
                    first = False
                    continue
                recovered = await self._recover_for(
                    recovered, epoch, f"unreachable ({type(e).__name__}: {e})"
                )
                continue
            except httpx.TransportError as e:
                raise RolloutError(
                    f"{self.name} is unreachable ({type(e).__name__}: {e})" + self._log_hint()
                ) from e
            if response.status_code >= 500 and self._server_down():
                # vLLM answers 500 while its engine core dies, then exits.
                recovered = await self._recover_for(
                    recovered, epoch, f"answered {response.status_code} and exited"
                )
                continue
            return response

    async def _recover_for(self, recovered: int, epoch: int, why: str) -> int:
        """One more recovery for a request that has had ``recovered``; raises past the cap
        (a server that answers /health but fails every request would loop forever)."""
        if not self.recover_in_place:
            raise EngineUnavailable(f"{self.name} {why}" + self._log_hint())
        if recovered >= self.max_request_recoveries:
            raise RolloutError(
                f"{self.name} {why}, again after {recovered} recoveries; giving up"
                + self._log_hint()
            )
        await self._recover(epoch, why)
        return recovered + 1

    def _completion(
        self, data: dict[str, Any], *, greedy: bool, top_logprobs: int = 0
    ) -> Completion:
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
            top_logprobs=[_top(c, top_logprobs) for c in content] if top_logprobs else None,
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
        slots = self._loop_state()
        async with slots:
            response = await self._post("/inference/v1/generate", _score_body(tokens))
        return _scores(response, tokens)

    def _loop_state(self) -> asyncio.Semaphore:
        """The in-flight bound and recovery lock of the running loop (made on first use)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:
            self._loop = loop
            self._slots = asyncio.Semaphore(self.max_in_flight)
            self._recovering = asyncio.Lock()
        return self._slots

    def _client_now(self) -> httpx.AsyncClient:
        """This loop's client for the current URL (a restarted server has a new port)."""
        key = (asyncio.get_running_loop(), self.base_url)
        if self._client is None or self._client_key != key:
            if self._client is not None and self._client_key and self._client_key[0] is key[0]:
                self._retired.append(self._client)  # closed by `aclose`, in this loop
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
            self._client_key = key
        return self._client

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[VllmEngine]:
        """Closes this loop's HTTP connections when the block ends."""
        try:
            yield self
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        clients = [c for c in (self._client, *self._retired) if c is not None]
        self._client, self._client_key, self._retired = None, None, []
        for client in clients:
            await client.aclose()

    # --- recovery -----------------------------------------------------------------

    def _server_down(self) -> bool:
        return self.server is not None and not self.server.running

    async def _recover(self, epoch: int, why: str) -> None:
        """Bring the server back (once for all the requests that saw it fail), or raise."""
        assert self._recovering is not None
        async with self._recovering:
            if self._epoch != epoch:
                return  # another request recovered it meanwhile
            await asyncio.to_thread(self._recover_blocking, why)

    def recover(self, why: str, weights: PreparedWeights | None = None) -> None:
        """Bring the server back and onto ``weights`` (a fleet's newest, which this engine
        does not own) or else its current weights, checked (blocking; a fleet calls it on
        a thread of its own). Raises `RolloutError` when it cannot."""
        self._recover_blocking(why, weights)

    def _recover_blocking(self, why: str, weights: PreparedWeights | None = None) -> None:
        """Restart an owned server that exited, or wait for one that went away; then push
        the current weights again and check them. Any thread; raises `RolloutError`."""
        with self._update_lock:
            log.warning("%s %s; recovering it", self._log_name, why)
            deadline = time.monotonic() + self.reconnect_timeout_s
            with httpx.Client(timeout=5.0, transport=self._admin_transport) as client:
                while True:
                    if self.server is not None and not self.server.running:
                        code = self.server.returncode
                        if self.restarts >= self.max_restarts:
                            raise RolloutError(
                                f"the vLLM server exited (code {code}) again after "
                                f"{self.restarts} restarts this run; giving up" + self._log_hint()
                            )
                        self.restarts += 1
                        self.server.restart()  # raises RolloutError when it cannot start
                        self.base_url = self.server.url
                        why = f"{why}; the server exited (code {code}) and was restarted"
                        break
                    with contextlib.suppress(httpx.TransportError):
                        if client.get(f"{self.base_url}/health").status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise RolloutError(
                            f"{self.name} {why}, and did not answer /health for "
                            f"{self.reconnect_timeout_s:.0f} s" + self._log_hint()
                        )
                    time.sleep(0.5)
            self.recoveries.append(why)
            if weights is not None:
                self._current_weights, self._owned_current = weights.folder, False
                self._version, self._expected = weights.version, weights.expected
            if self._current_weights is not None:
                # A restarted server holds the weights it started with: ours again.
                with self._admin_client() as admin:
                    self._push(admin, self._current_weights, self._version)
                    self._verify(admin, self._version)
            self._epoch += 1

    # --- weights ------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        """Publish ``params`` as ``version``; blocks until the server samples with them.

        Called from the trainer's thread, not the event loop: the requests in flight
        are drained by the server while this waits.
        """
        self.publish(self.prepare(params, version), owned=True)

    def prepare(self, params: Any, version: int) -> PreparedWeights:
        """``params`` written as the files a server loads, and the probe's logprobs under
        them: what `publish` gives one server, or a fleet each of its servers (one write
        for all; `rl_core.rollout.fleet`)."""
        if self._write_weights is None:
            raise RolloutError(
                "this VllmEngine has no write_weights; give it one to update the served weights"
            )
        started = time.perf_counter()
        with self._root_lock:  # not the update lock: a recovery may hold that for minutes
            if self._weights_root is None:
                self._weights_root = Path(
                    tempfile.mkdtemp(prefix="rlaas-vllm-weights-", dir=self._weights_dir)
                )
            root = self._weights_root
        folder = root / f"v{version}-{uuid.uuid4().hex[:8]}"
        self._write_weights(params, folder)
        written = time.perf_counter()
        expected = list(self._check.scorer(params, self._check.tokens)) if self._check else None
        return PreparedWeights(folder, version, expected, write_s=written - started)

    def publish(self, prepared: PreparedWeights, *, owned: bool) -> None:
        """The server samples with ``prepared`` from now on, checked by the probe.
        ``owned``: this engine deletes the folder once a later version replaces it (a
        fleet's folders are the fleet's to delete)."""
        with self._update_lock:
            started = time.perf_counter()
            start_us = now_us()
            folder, version = prepared.folder, prepared.version
            with self._admin_client() as admin:
                try:
                    pause_s = self._push(admin, folder, version)
                except _ServerDown as down:
                    if not self.recover_in_place:
                        raise EngineUnavailable(f"{self.name} {down}") from down
                    self._recover_blocking(str(down))  # pushes the previous weights back
                    admin.base_url = httpx.URL(self.base_url)
                    pause_s = self._push(admin, folder, version)
                finished = time.perf_counter()
                previous, self._current_weights = self._current_weights, folder
                self._version, self._expected = version, prepared.expected
                worst = self._verify(admin, version)
            if previous is not None and self._owned_current and previous != folder:
                shutil.rmtree(previous, ignore_errors=True)
            self._owned_current = owned
            update = WeightUpdate(
                version=version,
                write_s=prepared.write_s,
                pause_s=pause_s,
                total_s=prepared.write_s + finished - started,
                check_max_dlogprob=worst,
            )
            self.updates.append(update)
            if self._recorder is not None:
                # The pause is the one part of an update in which the server serves nothing.
                self._recorder.add(
                    "engine_paused",
                    start_us=start_us + int((finished - started - pause_s) * 1e6),
                    dur_us=int(pause_s * 1e6),
                    track="engine",
                    step=version,
                )

    def _admin_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, timeout=self.admin_timeout_s, transport=self._admin_transport
        )

    def _push(self, admin: httpx.Client, folder: Path, version: int) -> float:
        """Load ``folder``'s weights as ``version``; returns the pause in seconds."""
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
        return time.perf_counter() - paused

    def _verify(self, admin: httpx.Client, version: int) -> float | None:
        """The probe's max |Δ logprob| (server vs trainer); raises past the tolerance."""
        if self._check is None or self._expected is None:
            return None
        try:
            response = admin.post("/inference/v1/generate", json=_score_body(self._check.tokens))
        except httpx.HTTPError as e:
            raise RolloutError(
                f"{self.name} did not score the weight probe ({type(e).__name__})"
                + self._log_hint()
            ) from e
        served = _scores(response, self._check.tokens)
        worst = max(abs(a - b) for a, b in zip(served, self._expected, strict=True))
        if not worst <= self._check.tolerance:  # NaN fails too
            raise RolloutError(
                f"{self.name} does not serve the weights of version {version}: "
                f"its logprobs of a {len(self._check.tokens)}-token probe differ from the "
                f"trainer's by up to {worst:.3g} (tolerance {self._check.tolerance:g}). The "
                "server kept old weights or serves another model; a server at rollout.vllm_url "
                "must serve the run's model and read the worker's weight files"
            )
        return worst

    def _admin(self, client: httpx.Client, path: str, **kwargs: Any) -> None:
        try:
            response = client.post(path, **kwargs)
        except _DOWN as e:
            raise _ServerDown(f"failed on {path} ({type(e).__name__}: {e})") from e
        except httpx.HTTPError as e:
            raise RolloutError(
                f"{self.name}: {path} failed ({type(e).__name__}: {e})" + self._log_hint()
            ) from e
        if response.status_code == 404:
            raise RolloutError(
                f"{self.name} has no {path}; start it with VLLM_SERVER_DEV_MODE=1 "
                "(rlaas does when it starts the server)"
            )
        if response.status_code >= 500 and self._server_down():
            raise _ServerDown(f"answered {response.status_code} on {path} and exited")
        if response.status_code != 200 or '"success":false' in response.text.replace(" ", ""):
            raise RolloutError(
                f"{self.name}: {path} answered {response.status_code}: "
                f"{response.text[:500]}"
                + (" (does the server serve the run's model?)" if path == "/collective_rpc" else "")
            )

    def update_metrics(self) -> dict[str, float]:
        """The last update's figures, for the step's metrics (``vllm/``)."""
        if not self.updates:
            return {}
        last = self.updates[-1]
        metrics = {
            "vllm/pause_s": last.pause_s,
            "vllm/write_s": last.write_s,
            "vllm/update_s": last.total_s,
            "vllm/recoveries": float(len(self.recoveries)),
        }
        if last.check_max_dlogprob is not None:
            metrics["vllm/check_max_dlogprob"] = last.check_max_dlogprob
        return metrics

    def close(self) -> None:
        """Removes the weight files (the HTTP client is closed by `aclose`/`serving`).

        Waits for an update in progress: its files would otherwise outlive the engine.
        """
        with self._update_lock:
            root, self._weights_root = self._weights_root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class PreparedWeights:
    """Weights written for vLLM to load (`VllmEngine.prepare`), with the probe's expected
    logprobs under them."""

    folder: Path
    version: int
    expected: list[float] | None
    write_s: float


class EngineUnavailable(RolloutError):
    """The server is gone and this engine does not recover it in place (a fleet's member):
    the request was not served, and may be sent elsewhere."""


class _ServerDown(Exception):
    """An admin call found the server gone; the caller recovers it and tries again."""


def _score_body(tokens: Sequence[int]) -> dict[str, Any]:
    if len(tokens) < 2:
        raise RolloutError("score needs at least two tokens")
    return {
        "token_ids": list(tokens),
        "sampling_params": {
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "ignore_eos": True,
            "detokenize": False,
        },
    }


def _scores(response: httpx.Response, tokens: Sequence[int]) -> list[float]:
    if response.status_code != 200:
        raise RolloutError(f"vLLM refused a score request: {response.text[:500]}")
    rows = response.json()["prompt_logprobs"][1:]
    return [float(row[str(t)]["logprob"]) for row, t in zip(rows, tokens[1:], strict=True)]


def _top(content: dict[str, Any], k: int) -> list[tuple[int, float]]:
    """One token's k most likely alternatives from vLLM's list (the sampled token first,
    then by rank). vLLM writes -inf as -9999: a token that cannot be drawn, left out as the
    JAX engine leaves it out."""
    listed = [
        (int(t["token_id"]), float(t["logprob"]))
        for t in content.get("top_logprobs") or []
        if float(t["logprob"]) > _VLLM_NO_LOGPROB
    ]
    return sorted(listed, key=lambda pair: -pair[1])[:k]


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first

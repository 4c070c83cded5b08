"""The model side of the Tinker-compatible API: LoRA models on shared base models, over HTTP.

The control plane (``app/api/tinker.py``) owns keys, tenants and futures; it forwards each
work call here as JSON and stores the answer. This server holds, in memory:

- base models by name (``builtin:tiny``, ``pkg:...``), loaded on first use, each with a
  `JaxEngine` that samples the base alone and one per LoRA config whose adapter slots hold
  sampler snapshots (`worker/tinker_sampling.py`): concurrent samples of different models
  run in one batch, each row with its own adapter, on the base's one copy of the weights;
- LoRA models by id, each a slot of its base's `LoraPool` for its rank (`worker/tinker_pool.py`:
  one `rl_core.training.multi_trainer.MultiLoraTrainer` whose slots are the models'
  adapters): pending forward_backward calls of several models run as one batch;
- sampler snapshots by path: the model's adapter frozen at ``save_weights_for_sampler`` (a
  few MB), so training that goes on never changes what a sampler answers.

Saved training state (``save_weights`` / ``load_weights``: the SDK's save_state, load_state
and create_training_client_from_state) is not kept here but in the artifact store
(`rl_core.training.slot_state`, under the key the control plane names): a model's adapter,
Adam moments and step count, which any worker serving the base loads into a slot, so a
worker that stops no longer takes a saved model with it.

Training calls of a model are applied in ``seq_id`` order (the client numbers them from
1 and may send them concurrently): a call waits for its predecessor, up to `SEQ_WAIT_S`.

Routes (behind ``Authorization: Bearer <RLAAS_TINKER_TOKEN>``), JSON in and out:
``POST /models`` (with ``state``: filled from a saved state),
``POST /models/{id}/{forward_backward|optim_step|save_for_sampler|save_state|load_state}``,
``POST /sample``. A refusal is ``{"error", "category": "user"}`` with a 4xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
from typing import Any

import httpx
from aiohttp import web

from rl_core.errors import RlCoreError
from rl_core.protocol.internal import TinkerWorkerBody, TinkerWorkerRead
from rl_core.store import ArtifactStore
from worker.tinker_pool import FIRST_SLOTS, LoraPool, gather_window_s
from worker.tinker_sampling import (
    SAMPLER_SLOTS,
    SlotCache,
    Snapshot,
    sampler_slots,
    sampling_engine,
)

log = logging.getLogger(__name__)

SEQ_WAIT_S = 300.0  # a lost predecessor fails its successors after this, not never
MAX_BODY_BYTES = 256 * 1024 * 1024


class Refused(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class _Base:
    model: Any
    tokenizer: Any
    engine: Any  # samples the base alone
    pools: dict[int, LoraPool] = dataclasses.field(default_factory=dict)  # by LoRA rank
    # Engines whose adapter slots hold sampler snapshots, by LoRA config (rank, targets).
    sampling: dict[Any, SlotCache] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Trained:
    pool: LoraPool
    slot: int
    base: str
    next_seq: int = 1
    turn: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition)


class TinkerWorker:
    """Bases, LoRA models and sampler snapshots of this process."""

    def __init__(
        self,
        bases: tuple[str, ...],
        store: ArtifactStore | None = None,
        *,
        gather_s: float = 0.0,
        sampler_slots: int = SAMPLER_SLOTS,
    ) -> None:
        self.allowed = bases
        self.store = store  # where saved training state goes (None: save_state is refused)
        self.gather_s = gather_s  # each LoraPool's gathering window (worker/tinker_pool.py)
        self.bases: dict[str, _Base] = {}
        self.models: dict[str, _Trained] = {}
        self.samplers: dict[str, Snapshot] = {}  # path -> the adapter saved there
        self.sampler_slots = sampler_slots
        self._loading = asyncio.Lock()
        # The engines' serving blocks: entered on the worker's event loop at first use,
        # left by `close` (a worker lives on one loop: its engines' batches are bound to it).
        self._serving = contextlib.AsyncExitStack()
        self._served: set[int] = set()  # ids of the engines serving

    async def base(self, name: str) -> _Base:
        if name not in self.allowed:
            raise Refused(
                f"base_model {name!r} is not served here; use one of {list(self.allowed)}"
            )
        async with self._loading:
            if name not in self.bases:
                self.bases[name] = await asyncio.to_thread(_load_base, name)
        return self.bases[name]

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        from rl_core.errors import UnsupportedSpec
        from rl_core.training.lora import LoraConfig
        from rl_core.training.multi_trainer import MultiLoraTrainer

        model_id, name = str(body["model_id"]), str(body["base_model"])
        rank, seed = int(body.get("rank", 8)), int(body.get("seed", 0))
        if rank < 1:
            raise UnsupportedSpec("lora_config.rank", f"rank must be at least 1, got {rank}")
        base = await self.base(name)
        if rank not in base.pools:  # models batch together only at the same rank
            lora = LoraConfig(rank=rank, alpha=float(rank), targets=("q", "k", "v", "o"))
            trainer = await asyncio.to_thread(
                MultiLoraTrainer, base.model, slots=FIRST_SLOTS, lora=lora
            )
            base.pools.setdefault(rank, LoraPool(trainer, gather_s=self.gather_s))
        pool = base.pools[rank]
        slot = await pool.run(lambda t: t.add(seed))
        state = body.get("state")
        if state is not None:  # create_training_client_from_state: the slot takes it
            try:
                await self._fill(pool, slot, name, rank, state)
            except BaseException:
                await pool.run(lambda t: t.remove(slot))
                raise
        self.models[model_id] = _Trained(pool=pool, slot=slot, base=name)
        return {"model_id": model_id}

    def _store(self) -> ArtifactStore:
        if self.store is None:
            raise Refused(
                "this worker has no artifact store for saved state (it reads "
                "RLAAS_ARTIFACT_STORE, else its artifacts folder)",
                status=503,
            )
        return self.store

    async def _fill(self, pool: LoraPool, slot: int, base: str, rank: int, state: Any) -> None:
        """Slot ``slot`` of ``pool`` takes the saved state ``{"key", "optimizer"}``, once
        its marker says it was saved from a model of this base and rank."""
        from rl_core.training.slot_state import read_info, read_state

        store, key, optimizer = self._store(), str(state["key"]), bool(state["optimizer"])
        info = (await asyncio.to_thread(read_info, store, key))["info"]
        if (info.get("base_model"), info.get("lora_rank")) != (base, rank):
            raise Refused(
                f"the state at {key} was saved from a rank-{info.get('lora_rank')} model on "
                f"{info.get('base_model')!r}; this model is rank {rank} on {base!r}"
            )
        loaded = await asyncio.to_thread(read_state, store, key, optimizer=optimizer)
        await pool.run(lambda t: t.import_slot(slot, loaded, optimizer=optimizer))

    async def save_state(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The model's adapter, Adam moments and step count, as the calls before ``seq_id``
        left them, written under ``key`` in the artifact store; answers the bytes written.
        The copy is taken in turn; the upload does not hold up the model's next calls."""
        from rl_core.training.slot_state import write_state

        key = str(body["key"])

        async def work(t: _Trained) -> tuple[dict[str, Any], Any]:
            self._store()  # refused in turn: its seq_id is spent, its successors go on
            state = await t.pool.run(lambda trainer: trainer.export_slot(t.slot))
            return {"base_model": t.base, "lora_rank": t.pool.trainer.lora.rank}, state

        info, state = await self.in_turn(model_id, body.get("seq_id"), work)
        store = self._store()
        size = await asyncio.to_thread(write_state, store, key, state, info)
        return {"key": key, "size_bytes": size, "store": store.url}

    async def load_state(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The saved state at ``key`` into this model, in turn: its adapter, and its Adam
        moments and step count when ``optimizer`` (else they start again from zero)."""

        async def work(t: _Trained) -> None:
            await self._fill(t.pool, t.slot, t.base, t.pool.trainer.lora.rank, body)

        await self.in_turn(model_id, body.get("seq_id"), work)
        return {"model_id": model_id}

    def model(self, model_id: str) -> _Trained:
        found = self.models.get(model_id)
        if found is None:
            raise Refused(f"model {model_id} is not loaded on this worker", status=404)
        return found

    async def in_turn(self, model_id: str, seq_id: int | None, work: Any) -> Any:
        """``await work(model)`` once every earlier ``seq_id`` of the model has been applied."""
        trained = self.model(model_id)
        async with trained.turn:
            if seq_id is not None:
                try:
                    await asyncio.wait_for(
                        trained.turn.wait_for(lambda: trained.next_seq >= seq_id), SEQ_WAIT_S
                    )
                except TimeoutError:
                    raise Refused(
                        f"seq_id {seq_id} waited {SEQ_WAIT_S:.0f} s for seq_id "
                        f"{trained.next_seq}, which never came; send calls in seq_id order",
                        status=409,
                    ) from None
                if seq_id < trained.next_seq:
                    raise Refused(
                        f"seq_id {seq_id} was already applied (next is {trained.next_seq})",
                        status=409,
                    )
            try:
                return await work(trained)
            finally:
                if seq_id is not None:
                    trained.next_seq = seq_id + 1
                trained.turn.notify_all()

    async def forward_backward(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        from rl_core.training.primitives import Datum

        data = [Datum(tokens=d["tokens"], inputs=d["inputs"]) for d in body["data"]]

        async def work(t: _Trained) -> dict[str, Any]:
            result = await t.pool.forward_backward(
                t.slot,
                data,
                str(body["loss_fn"]),
                bool(body.get("forward_only")),
                body.get("loss_fn_config"),
            )
            return {"logprobs": result.logprobs, "loss": result.loss}

        result: dict[str, Any] = await self.in_turn(model_id, body.get("seq_id"), work)
        return result

    async def optim_step(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        from rl_core.training.primitives import AdamParams

        fields = {f.name for f in dataclasses.fields(AdamParams)}
        params = AdamParams(**{k: float(v) for k, v in body["adam"].items() if k in fields})

        async def work(t: _Trained) -> dict[str, float]:
            return await t.pool.run(lambda trainer: trainer.optim_step(t.slot, params))

        metrics: dict[str, float] = await self.in_turn(model_id, body.get("seq_id"), work)
        return {"metrics": metrics}

    async def save_for_sampler(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        path = str(body["path"])

        async def work(t: _Trained) -> Snapshot:
            # The slot's adapter as it is now (new arrays: later steps leave them alone).
            adapters = await t.pool.run(lambda trainer: trainer.adapter(t.slot))
            return Snapshot(base=t.base, lora=t.pool.trainer.lora, adapters=adapters)

        snapshot = await self.in_turn(model_id, body.get("seq_id"), work)
        self._drop_snapshot(path)  # saved again under the same name: the old one is gone
        self.samplers[path] = snapshot
        return {"path": path}

    def _drop_snapshot(self, path: str) -> None:
        old = self.samplers.pop(path, None)
        base = None if old is None else self.bases.get(old.base)
        if old is not None and base is not None and old.lora in base.sampling:
            base.sampling[old.lora].forget(old)

    async def unload(self, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Drop the model and its sampler snapshots (the control plane's unload_model);
        one already gone is not an error: the caller wants it gone. Its slot in the base's
        trainer goes back to the pool, for the next model on that base."""
        trained = self.models.pop(model_id, None)
        if trained is not None:
            slot = trained.slot
            await trained.pool.run(lambda trainer: trainer.remove(slot))
        prefix = f"tinker://{model_id}/"
        for path in [p for p in self.samplers if p.startswith(prefix)]:
            self._drop_snapshot(path)
        return {"model_id": model_id}

    async def sample(self, body: dict[str, Any]) -> dict[str, Any]:
        from rl_core.protocol.tinker_sampling import read_scoring
        from rl_core.rollout.base import SamplingParams

        scoring = read_scoring(body, len(body["prompt"]))
        path = body.get("model_path")
        snapshot: Snapshot | None = None
        if path:
            if path not in self.samplers:
                raise Refused(f"no sampler weights at {path}; save them first", status=404)
            snapshot = self.samplers[path]
            name = snapshot.base
        else:
            name = str(body["base_model"])
        base = await self.base(name)
        n = int(body.get("num_samples", 1))
        seed = int(body.get("seed") or 0)
        stop_ids = [int(t) for t in body.get("stop_ids") or []]
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=max(0, int(body.get("top_k", -1))),
        )
        holding: contextlib.AbstractAsyncContextManager[int | None]
        if snapshot is None:
            engine, holding = base.engine, contextlib.nullcontext(None)
        else:
            cache = await self._slots(base, snapshot.lora)
            engine, holding = cache.engine, cache.holding(snapshot)
        await self._serve(engine)
        async with holding as slot:  # other models' samples share the batch, each its slot
            completions = await engine.generate(
                [list(body["prompt"])] * n,
                max_new_tokens=int(body.get("max_tokens") or 16),
                sampling=sampling,
                seeds=[seed + i for i in range(n)],
                top_logprobs=scoring.topk_sample,
                adapter_slot=slot,
            )
        sequences = []
        for c in completions:
            tokens, logprobs, reason = list(c.tokens), list(c.logprobs), c.finish_reason
            for i, token in enumerate(tokens):
                if token in stop_ids:
                    tokens, logprobs, reason = tokens[: i + 1], logprobs[: i + 1], "stop"
                    break
            seq = {"tokens": tokens, "logprobs": logprobs, "stop_reason": reason}
            if c.top_logprobs is not None:
                seq["topk"] = c.top_logprobs[: len(tokens)]
            sequences.append(seq)
        answer: dict[str, Any] = {"sequences": sequences}
        if scoring.scores_prompt:  # under the weights it sampled with
            answer.update(await _score(base, snapshot, body["prompt"], scoring))
        return answer

    async def _slots(self, base: _Base, lora: Any) -> SlotCache:
        """The engine whose adapter slots hold ``lora``'s snapshots on ``base``."""
        async with self._loading:  # one engine per config, however many calls ask at once
            if lora not in base.sampling:
                engine = await asyncio.to_thread(
                    sampling_engine, base.model, base.tokenizer, lora, self.sampler_slots
                )
                base.sampling[lora] = SlotCache(engine, self.sampler_slots)
        return base.sampling[lora]

    async def _serve(self, engine: Any) -> None:
        """Keep ``engine`` batching concurrent calls (its `serving` block) from now on.
        (Entering it does not suspend: a call right behind this one finds it entered.)"""
        if id(engine) not in self._served:
            self._served.add(id(engine))
            await self._serving.enter_async_context(engine.serving())

    async def close(self) -> None:
        """Stop the engines' batches and device threads."""
        await self._serving.aclose()
        for base in self.bases.values():
            for engine in [base.engine, *(c.engine for c in base.sampling.values())]:
                engine.close()


async def _score(
    base: _Base, snapshot: Snapshot | None, prompt: list[int], scoring: Any
) -> dict[str, Any]:
    """The prompt's logprobs (and top-k rows) under ``snapshot``'s weights (None: the
    base's own), on the engine's device thread (rl_core.training.scoring)."""
    from flax import nnx

    from rl_core.training.lora import merged_params
    from rl_core.training.scoring import score_prompt

    def run() -> Any:
        state = nnx.state(base.model)
        if snapshot is not None:  # the adapter merged into a copy of the base, for this call
            state = merged_params(state, snapshot.adapters, snapshot.lora)
        return score_prompt(
            base.model, state, prompt, last_n=scoring.last_n, topk=scoring.topk_prompt
        )

    scores = await asyncio.get_running_loop().run_in_executor(base.engine.executor, run)
    out: dict[str, Any] = {}
    if scoring.prompt_logprobs:
        out["prompt_logprobs"] = scores.logprobs
    if scores.topk is not None:
        out["topk_prompt_logprobs"] = scores.topk
    return out


def _load_base(name: str) -> _Base:
    from rl_core.pretrained.sources import load_model
    from rl_core.spec import ModelSpec

    model, tokenizer = load_model(ModelSpec(source=name), seed=0)
    return _Base(model, tokenizer, sampling_engine(model, tokenizer, None, 0))


def tinker_app(worker: TinkerWorker, *, token: str) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            return web.json_response(
                {"error": "this server answers the control plane only", "category": "user"},
                status=401,
            )
        try:
            answer: web.StreamResponse = await handler(request)
            return answer
        except Refused as exc:
            return web.json_response({"error": str(exc), "category": "user"}, status=exc.status)
        except (RlCoreError, KeyError, TypeError, ValueError) as exc:
            return web.json_response({"error": str(exc), "category": "user"}, status=400)
        except Exception:
            log.exception("tinker worker: %s failed", request.path)
            return web.json_response(
                {"error": "the worker failed this call (see its log)", "category": "server"},
                status=500,
            )

    async def create(request: web.Request) -> web.Response:
        return web.json_response(await worker.create(await request.json()))

    async def model_call(request: web.Request) -> web.Response:
        model_id, action = request.match_info["model_id"], request.match_info["action"]
        calls = {
            "forward_backward": worker.forward_backward,
            "optim_step": worker.optim_step,
            "save_for_sampler": worker.save_for_sampler,
            "save_state": worker.save_state,
            "load_state": worker.load_state,
            "unload": worker.unload,
        }
        if action not in calls:
            raise Refused(f"unknown action {action}", status=404)
        return web.json_response(await calls[action](model_id, await request.json()))

    async def sample(request: web.Request) -> web.Response:
        return web.json_response(await worker.sample(await request.json()))

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[guard])
    app.router.add_post("/models", create)
    app.router.add_post("/models/{model_id}/{action}", model_call)
    app.router.add_post("/sample", sample)
    return app


async def serve(
    worker: TinkerWorker, *, token: str, host: str, port: int, bound: Any = None
) -> None:
    """Serve until cancelled; ``bound(url)`` is called once the socket listens."""
    runner = web.AppRunner(tinker_app(worker, token=token), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        url = f"http://{host}:{runner.addresses[0][1]}"
        log.info("tinker worker at %s, bases %s", url, worker.allowed)
        if bound is not None:
            bound(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await worker.close()


class Registration:
    """The worker's side of ``/internal/tinker/workers``: its URL, secret and bases told to
    the control plane (with this worker's credential), and withdrawn when it stops."""

    def __init__(self, api_url: str, credential: str) -> None:
        self._url = f"{api_url.rstrip('/')}/internal/tinker/workers"
        self._headers = {"Authorization": f"Bearer {credential}"}
        self.worker_id: str | None = None

    def register(self, url: str, token: str, bases: tuple[str, ...]) -> str:
        body = TinkerWorkerBody(url=url, token=token, bases=list(bases))
        r = httpx.post(self._url, json=body.model_dump(), headers=self._headers, timeout=30)
        r.raise_for_status()
        self.worker_id = TinkerWorkerRead.model_validate(r.json()).id
        return self.worker_id

    def deregister(self) -> None:
        if self.worker_id is not None:
            httpx.delete(f"{self._url}/{self.worker_id}", headers=self._headers, timeout=30)
            self.worker_id = None


def main() -> None:
    """``python -m worker.tinker_server``: serves on RLAAS_TINKER_HOST (127.0.0.1) :
    RLAAS_TINKER_PORT (8500) the bases of RLAAS_TINKER_BASES (builtin:tiny), and registers
    with the control plane at RLAAS_API_URL with RLAAS_WORKER_CREDENTIAL (docs/tinker.md).
    Its secret is RLAAS_TINKER_WORKER_TOKEN, or a fresh one; RLAAS_TINKER_GATHER_MS (0) is
    how long a forward_backward batch may wait for other active models' calls. Saved state
    goes to RLAAS_ARTIFACT_STORE, else to its artifacts folder (as the API's, on one machine).
    RLAAS_TINKER_SAMPLER_SLOTS (8) sampler snapshots per sampling engine are sampled without
    a reload."""
    import os
    import secrets

    from worker.settings import WorkerSettings

    logging.basicConfig(level=logging.INFO)
    settings = WorkerSettings()
    token = os.environ.get("RLAAS_TINKER_WORKER_TOKEN") or secrets.token_urlsafe(32)
    names = os.environ.get("RLAAS_TINKER_BASES", "builtin:tiny").split(",")
    bases = tuple(b.strip() for b in names if b.strip())
    host = os.environ.get("RLAAS_TINKER_HOST", "127.0.0.1")
    port = int(os.environ.get("RLAAS_TINKER_PORT", "8500"))
    public = os.environ.get("RLAAS_TINKER_PUBLIC_URL")  # as the API reaches it, if not host:port
    gather_s = gather_window_s(os.environ)  # a bad value stops it here, naming the setting
    slots = sampler_slots(os.environ)
    registration = Registration(settings.api_url, settings.resolved_worker_token())

    def bound(url: str) -> None:
        worker_id = registration.register(public or url, token, bases)
        log.info("registered with the control plane as %s", worker_id)

    worker = TinkerWorker(
        bases, store=settings.state_store(), gather_s=gather_s, sampler_slots=slots
    )
    try:
        asyncio.run(serve(worker, token=token, host=host, port=port, bound=bound))
    finally:
        registration.deregister()


if __name__ == "__main__":
    main()

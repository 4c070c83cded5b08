"""Start and stop a vLLM OpenAI-compatible server from vLLM's own virtualenv.

vLLM pins torch, transformers and fastapi versions that conflict with ours, so it never
runs in our interpreter: `scripts/vllm_venv.sh` builds ``.venv-vllm`` and the server is a
child process of that venv's python (`vllm_python`, or ``RLAAS_VLLM_PYTHON``). The server
listens on 127.0.0.1 only: its dev-mode routes (``/collective_rpc``, ``/pause``, weight
reloads), which `VllmEngine` needs, must never be reachable from another host.

The flags are those measured in docs/vllm.md: token ids in and out with no tokenizer
(``--skip-tokenizer-init``), ``/inference/v1/generate`` (``--enable-scale-out``), logprobs
of the distribution actually sampled from (``--logprobs-mode processed_logprobs``), and
eager mode, which starts in about half the time of a compiled server on two cores.

A model folder with a ``tokenizer.json`` is served with its tokenizer: vLLM's structured
outputs (the grammars of `VllmEngine.generate`) need one. Grammars go to llguidance
(``backend: guidance``), the library the JAX engine uses, so both read llguidance's Lark.
Up to 21 logprobs per token: the sampled token comes first in vLLM's list, so k + 1 of
them hold the top k (`VllmEngine`).

::

    with VllmServer(model_dir, VllmServerConfig(max_model_len=512)) as server:
        engine = VllmEngine(server.url, ...)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from rl_core.errors import RolloutError
from rl_core.host import lifeline

__all__ = ["VllmServer", "VllmServerConfig", "vllm_python"]

_REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> Path:
    """The vLLM venv's interpreter: ``RLAAS_VLLM_PYTHON``, else ``.venv-vllm`` in the repo."""
    configured = os.environ.get("RLAAS_VLLM_PYTHON")
    return Path(configured) if configured else _REPO / ".venv-vllm" / "bin" / "python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class VllmServerConfig:
    max_model_len: int  # prompt + new tokens of one request
    max_num_seqs: int = 64  # requests decoded together
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: the CPU KV cache, allocated at start
    max_num_batched_tokens: int = 4096  # tokens per engine step (at least max_model_len)
    enforce_eager: bool = True  # no torch.compile: ~32 s to healthy instead of ~67 s
    threads: int | None = None  # OMP threads of the model worker; None: vLLM's own choice
    seed: int = 0
    start_timeout_s: float = 300.0
    python: Path | None = None  # None: `vllm_python()`
    cpus: str | None = None  # taskset's list ("1", "2-3"): the cores the server may use
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()  # e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING


class VllmServer:
    """One server process (and its process group) serving ``model_dir`` on a loopback port.

    `start` returns once ``/health`` answers and one token has been generated: vLLM on CPU
    accepts some models at start that its attention kernels refuse at the first request
    (``head_dim`` below 32), and a run should fail here, not at its first episode.
    """

    served_name = "policy"

    def __init__(
        self, model_dir: str | Path, config: VllmServerConfig, *, log_path: Path | None = None
    ) -> None:
        self.model_dir = Path(model_dir)
        self.config = config
        self.log_path = log_path
        self.port = 0
        self.start_s: float | None = None  # seconds from spawn to the first token
        self._process: subprocess.Popen[bytes] | None = None
        self._log: contextlib.ExitStack | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def has_tokenizer(self) -> bool:
        """The folder holds a tokenizer: served with it, so grammars can be compiled."""
        return (self.model_dir / "tokenizer.json").is_file()

    def command(self) -> list[str]:
        c = self.config
        python = c.python or vllm_python()
        args = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", "float32",
            "--max-model-len", str(c.max_model_len),
            "--max-num-seqs", str(c.max_num_seqs),
            *([] if self.has_tokenizer else ["--skip-tokenizer-init"]),
            "--structured-outputs-config", '{"backend": "guidance"}',
            "--max-logprobs", "21",
            "--enable-scale-out",
            "--logprobs-mode", "processed_logprobs",
            "--generation-config", "vllm",
            "--seed", str(c.seed),
            "--disable-uvicorn-access-log",
            # vllm-cpu 0.32: a seeded request whose prefill is split over two engine
            # steps kills the engine core ("CPU Generator does not use offset"), and
            # every request carries a seed. Whole prefills only.
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(max(c.max_num_batched_tokens, c.max_model_len)),
        ]  # fmt: skip
        if c.enforce_eager:
            args.append("--enforce-eager")
        pin = ["taskset", "-c", c.cpus] if c.cpus else []
        return [*pin, *args, *c.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # /pause, /resume, /collective_rpc, /update_weight_version
            VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_gib),
            # Binding OpenMP threads to cores assumes the machine is vLLM's alone.
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            # The model runs in the engine core's process (vLLM's one-process executor, as
            # on one GPU), not in a third process of its own: each process imports torch
            # and vLLM again, and that was a third of the start (~110 s -> ~50-85 s on
            # two busy cores). vLLM's CPU platform asks for the executor process only to
            # bind OpenMP threads to cores, which is off here.
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            # Idle HTTP connections live 60 s (default 5): the engine's pool keeps them 2 s,
            # so the server never closes one the engine is about to send on.
            VLLM_HTTP_TIMEOUT_KEEP_ALIVE="60",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
        )
        if self.config.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.config.threads)
        env.update(self.config.extra_env)
        return env

    def start(self) -> VllmServer:
        python = self.config.python or vllm_python()
        if not Path(python).exists():
            raise RolloutError(
                f"no vLLM interpreter at {python}; build the venv with scripts/vllm_venv.sh "
                "or set RLAAS_VLLM_PYTHON to the python of a venv where `import vllm` works"
            )
        if not (self.model_dir / "config.json").exists():
            raise RolloutError(f"{self.model_dir} is not a Hugging Face model folder (config.json)")
        self.port = _free_port()
        self._log = contextlib.ExitStack()
        out = (
            self._log.enter_context(self.log_path.open("ab"))
            if self.log_path
            else subprocess.DEVNULL
        )
        started = time.monotonic()
        # A session of its own: `stop` signals the API server, its engine core and its
        # model worker together. Led by a lifeline, which ends the session if this
        # process dies without stopping it (a SIGKILLed worker runs no cleanup).
        self._process = subprocess.Popen(
            lifeline.command(os.getpid(), self.command()),
            env=self.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout_s``.

        vLLM 0.32's API server was seen to hang in its own shutdown after SIGTERM
        (its engine core already gone), hence the short wait.
        """
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout_s)
        if process is not None:
            # The engine core and the model worker may outlive the API server: the group
            # is killed and waited for, so no vLLM process outlives `stop`.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout_s
            while _group_alive(process.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def pid(self) -> int | None:
        """The server's process group's id (its lifeline's pid): signal it with killpg."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code of a server that ended by itself; None while it runs."""
        return None if self._process is None else self._process.poll()

    def restart(self) -> VllmServer:
        """Stop what is left of the server and start it again, on a new port (`url`).

        For a server that crashed: it comes back with the weights of ``model_dir``; the
        engine pushes the current ones again.
        """
        self.stop()
        return self.start()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self, started: float) -> None:
        deadline = started + self.config.start_timeout_s
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                if self._process is None or self._process.poll() is not None:
                    code = None if self._process is None else self._process.returncode
                    raise RolloutError(
                        f"the vLLM server exited with code {code} while starting"
                        + (f"; its log is {self.log_path}" if self.log_path else "")
                    )
                if time.monotonic() > deadline:
                    raise RolloutError(
                        f"the vLLM server did not answer /health within "
                        f"{self.config.start_timeout_s:.0f} s; raise start_timeout_s"
                        + (f" or read {self.log_path}" if self.log_path else "")
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        break
                time.sleep(0.25)
            probe = client.post(
                "/inference/v1/generate",
                json={"token_ids": [0], "sampling_params": {"max_tokens": 1}},
                timeout=max(deadline - time.monotonic(), 10.0),
            )
            if probe.status_code != 200:
                raise RolloutError(
                    f"the vLLM server started but cannot generate ({probe.status_code}: "
                    f"{probe.text[:300]}); on CPU its attention needs head_dim >= 32"
                )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_port() -> int:
    # The port is free when this returns; another process could take it before vLLM
    # binds it, in which case the server exits and `start` says so.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

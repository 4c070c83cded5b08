"""`TrainerHosts` as K child processes of this one, on this machine (no Ray).

For tests and benchmarks of the SPMD trainer without a cluster engine, and for a
single-machine run: children are spawned (never forked: JAX must not be forked after it
starts), each joins the K-process JAX job on a loopback coordinator and builds its
`TrainerHost`; calls travel over pipes. A child that dies or a call that passes
``timeout_s`` stops all K and raises `TrainerHostLost`. A deployed multi-host run uses
Ray's placement and failure detection instead (worker/trainer_hosts.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from rl_core.errors import TrainerHostLost

# (mesh) -> Trainer, picklable (a module-level function or a partial of one).
TrainerFactory = Callable[[Any], Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve(
    conn: Connection, coordinator: str, count: int, index: int, factory: TrainerFactory
) -> None:
    from rl_core.training.spmd import TrainerHost, init_distributed

    init_distributed(coordinator, count, index)
    host = TrainerHost(factory)
    conn.send(("ok", None))
    while True:
        method, payload = conn.recv()
        if method == "close":
            return
        try:
            conn.send(("ok", host.handle(method, payload)))
        except Exception as exc:  # sent back: the parent raises it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class LocalHosts:
    """K spawned trainer processes; ``timeout_s`` bounds the start and every call."""

    def __init__(self, count: int, factory: TrainerFactory, *, timeout_s: float = 300) -> None:
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        coordinator = f"127.0.0.1:{free_port()}"
        self._conns: list[Connection] = []
        self.processes: list[Any] = []
        for i in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve, args=(child, coordinator, count, i, factory), daemon=True
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self.processes.append(proc)
        self._gather("start")

    @property
    def count(self) -> int:
        return len(self._conns)

    def call(self, method: str, payloads: Sequence[Any]) -> list[Any]:
        if len(payloads) != self.count:
            raise ValueError(f"{len(payloads)} payloads for {self.count} trainer processes")
        for conn, payload in zip(self._conns, payloads, strict=True):
            conn.send((method, payload))
        return self._gather(method)

    def _gather(self, method: str) -> list[Any]:
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(answers) < self.count:
            left = deadline - time.monotonic()
            waiting = [c for i, c in enumerate(self._conns) if i not in answers]
            ready = wait(waiting, timeout=max(left, 0)) if left > 0 else []
            if not ready:
                self.close()
                raise TrainerHostLost(
                    f"{method}: {self.count - len(answers)} of {self.count} trainer processes "
                    f"did not answer within {self.timeout_s:g} s; all are stopped"
                )
            for ready_conn in ready:
                index = self._conns.index(ready_conn)  # type: ignore[arg-type]
                conn = self._conns[index]
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    self.close()
                    raise TrainerHostLost(
                        f"{method}: trainer process {index} of {self.count} died; all are stopped"
                    ) from None
                if status == "error":
                    self.close()
                    raise RuntimeError(f"trainer process {index}, {method}: {value}")
                answers[index] = value
        return [answers[i] for i in range(self.count)]

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):  # already closed, or dead
                conn.send(("close", None))
        for proc in self.processes:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()


__all__ = ["LocalHosts", "free_port"]

"""A run's K trainer processes as Ray actors: gang start, calls, failure detection.

Ray places the K actors in one placement group (all K bundles reserved or none: a gang
start, bounded by ``start_timeout_s``), and reports an actor whose process died
(`ray.exceptions.RayActorError`). The worker process that runs the pipeline is Ray's
driver and never joins the trainer's collectives. Actor 0's address is the
`jax.distributed` coordinator; every actor then builds its `TrainerHost`
(`rl_core.training.spmd`).

A call is sent to all K and its answers awaited one by one with one deadline: the first
death Ray reports (or the deadline) stops all K at once, since the survivors may be
blocked in a collective with the dead one, and raises `TrainerHostLost`; the worker ends
the attempt as a lost worker's (worker/job.py) and the run resumes from its checkpoint.

Ray is imported here only (rl_core never imports it), and started on first use:
``RLAAS_RAY_ADDRESS`` joins a running cluster; unset, a local one of this machine.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rl_core.errors import TrainerHostLost
from rl_core.host import lifeline
from rl_core.spec import MAX_HOSTS_BUILT

if TYPE_CHECKING:
    from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class TrainerProcess:
    """One trainer process (a Ray actor: `ray.remote` is applied in `RayHosts`)."""

    def __init__(self) -> None:
        self.host: Any = None

    def address(self) -> str:
        """A coordinator address of this actor's node (actor 0's is used)."""
        import ray

        from rl_core.training.local_hosts import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"  # type: ignore[no-untyped-call]

    def pid(self) -> int:
        import os

        return os.getpid()

    def start(self, coordinator: str, count: int, index: int, factory: Any) -> int:
        from rl_core.training.spmd import TrainerHost, init_distributed

        init_distributed(coordinator, count, index)
        self.host = TrainerHost(factory)
        return index

    def call(self, method: str, payload: Any) -> Any:
        return self.host.handle(method, payload)


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Ray started (or joined) once per process; later calls reuse it."""
    import ray

    if ray.is_initialized():
        return
    # Celery replaces sys.stderr with a logging proxy that has no file descriptor, and
    # ray.init enables faulthandler on sys.stderr: it gets the process's real one.
    stderr = sys.stderr
    sys.stderr = sys.__stderr__
    try:
        ray.init(
            address=address,
            num_cpus=None if address else num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    finally:
        sys.stderr = stderr
    if address is None:
        # A local cluster: its agents outlived a SIGKILLed worker (rl_core/host/lifeline.py).
        subprocess.Popen(
            lifeline.reaper_command(os.getpid()),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class RayHosts:
    """`rl_core.training.trainer_group.TrainerHosts` over K Ray actors in one placement group.

    ``bundle``: what one trainer process reserves (``{"CPU": 1}``; ``{"GPU": 8, "CPU":
    16}`` for a GPU host). ``strategy``: Ray's placement strategy (``"STRICT_SPREAD"``:
    one process per node, the multi-host layout; ``"PACK"`` on one machine).
    """

    def __init__(
        self,
        count: int,
        factory: Callable[[Any], Any],
        *,
        bundle: dict[str, float] | None = None,
        strategy: str = "PACK",
        start_timeout_s: float = 300,
        call_timeout_s: float = 1800,
        env: dict[str, str] | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.call_timeout_s = call_timeout_s
        self._count = count
        bundle = bundle or {"CPU": 1}
        self._pg = placement_group([dict(bundle)] * count, strategy=strategy)
        self._remove_pg = remove_placement_group
        self.actors: list[Any] = []
        try:
            ready, _ = ray.wait([self._pg.ready()], timeout=start_timeout_s)
            if not ready:
                raise TrainerHostLost(
                    f"Ray could not place {count} trainer processes of {bundle} "
                    f"({strategy}) within {start_timeout_s:g} s; none was started "
                    f"(cluster resources: {ray.cluster_resources()})"  # type: ignore[no-untyped-call]
                )
            remote = ray.remote(TrainerProcess)
            for i in range(count):
                self.actors.append(
                    remote.options(
                        num_cpus=bundle.get("CPU", 0),
                        num_gpus=bundle.get("GPU", 0),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=self._pg, placement_group_bundle_index=i
                        ),
                        runtime_env={"env_vars": env} if env else None,
                        max_restarts=0,
                    ).remote()
                )
            first = self.actors[0].address.remote()
            (coordinator,) = self._wait([first], "address", start_timeout_s)
            self._wait(
                [a.start.remote(coordinator, count, i, factory) for i, a in enumerate(self.actors)],
                "start",
                start_timeout_s,
            )
        except BaseException:
            self.close()
            raise

    @property
    def count(self) -> int:
        return self._count

    def pids(self) -> list[int]:
        """The actors' process ids (tests kill one)."""
        return list(self._wait([a.pid.remote() for a in self.actors], "pid", 60))

    def call(self, method: str, payloads: Sequence[Any]) -> list[Any]:
        if len(payloads) != self.count:
            raise ValueError(f"{len(payloads)} payloads for {self.count} trainer processes")
        if not self.actors:
            raise TrainerHostLost(f"{method}: the trainer processes were stopped")
        refs = [a.call.remote(method, p) for a, p in zip(self.actors, payloads, strict=True)]
        return self._wait(refs, method, self.call_timeout_s)

    def _wait(self, refs: list[Any], method: str, timeout_s: float) -> list[Any]:
        """The refs' values in order; the first death or the deadline stops all K."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        deadline = time.monotonic() + timeout_s
        values: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
            if not ready:
                self.close()
                raise TrainerHostLost(
                    f"{method}: {len(pending)} of {len(refs)} trainer processes did not answer "
                    f"within {timeout_s:g} s; all are stopped"
                )
            ref = ready[0]
            try:
                values[refs.index(ref)] = ray.get(ref, timeout=0)
            except RayActorError as exc:
                self.close()
                raise TrainerHostLost(
                    f"{method}: trainer process {refs.index(ref)} of {len(refs)} died "
                    f"({type(exc).__name__}); all are stopped"
                ) from None
            except RayTaskError as exc:
                # A survivor's collective fails when its peer dies, often before Ray
                # reports the death: a peer gone makes it a lost host, else it is a bug.
                dead = self._dead(pending)
                self.close()
                if dead:
                    raise TrainerHostLost(
                        f"{method}: a trainer process died; all are stopped ({exc.cause!r})"
                    ) from None
                raise exc.as_instanceof_cause() from None  # type: ignore[no-untyped-call]
            except GetTimeoutError:  # pragma: no cover - ready refs never time out
                continue
        return [values[i] for i in range(len(refs))]

    def _dead(self, pending: list[Any]) -> bool:
        """Whether any pending call's actor died (waits a few seconds for Ray to notice)."""
        import ray
        from ray.exceptions import RayActorError

        for ref in ray.wait(pending, num_returns=len(pending), timeout=10)[0]:
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                return True
            except Exception:  # another failure of the same collective
                continue
        return False

    def close(self) -> None:
        """Kill every actor (a survivor may sit in a collective forever) and free the
        placement group; idempotent."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                log.debug("trainer actor already gone", exc_info=True)
        self.actors = []
        if self._pg is not None:
            try:
                self._remove_pg(self._pg)
            except Exception:
                log.debug("placement group already removed", exc_info=True)
            self._pg = None


def ray_starter(settings: WorkerSettings) -> Callable[[int, Callable[[Any], Any]], RayHosts]:
    """``start(K, factory)`` for `rl_core.pipeline.hosted`: K actors as ``settings`` say."""

    def start(count: int, factory: Callable[[Any], Any]) -> RayHosts:
        # A local cluster (no RLAAS_RAY_ADDRESS) is this machine alone, started once for
        # every later run: sized for the largest run, as Ray's CPUs are only counters.
        ensure_ray(
            settings.ray_address, num_cpus=math.ceil(MAX_HOSTS_BUILT * settings.trainer_host_cpus)
        )
        bundle = {"CPU": settings.trainer_host_cpus}
        if settings.trainer_host_gpus:
            bundle["GPU"] = settings.trainer_host_gpus
        return RayHosts(
            count,
            factory,
            bundle=bundle,
            strategy=settings.trainer_placement,
            start_timeout_s=settings.trainer_start_timeout_s,
            call_timeout_s=settings.trainer_call_timeout_s,
        )

    return start


__all__ = ["RayHosts", "TrainerProcess", "ensure_ray", "ray_starter"]

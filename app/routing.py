"""Where a run is sent: the Celery queue of the accelerator it asks for.

The operator declares what the deployment offers (`app.settings`, docs/accelerators.md):

- ``RLAAS_QUEUES``: each accelerator offered and its queue, ``cpu=rlaas-cpu,gpu=rlaas-gpu``;
- ``RLAAS_DEFAULT_ACCELERATOR``: where a spec that names none goes (unset: the first one
  listed);
- without ``RLAAS_QUEUES``, ``RLAAS_TASK_QUEUE`` (default ``cpu``) is the deployment's one
  queue, as before runs named an accelerator: the queue of the accelerator it is named
  after (``cpu``, ``gpu``, ``tpu``), else of ``RLAAS_DEFAULT_ACCELERATOR``, else of cpu.

A run's accelerator is decided once, at submit (`Routes.admit`), and kept on its row, so
every later send of it (the reaper's re-queue after a lost lease, its redispatch of a run
still queued) goes to the same accelerator's queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import Unprocessable
from rl_core.spec import ACCELERATORS, MAX_HOSTS_BUILT, MAX_ROLLOUT_SERVERS_BUILT, ResourcesSpec

# What Redis, RabbitMQ and kombu's SQL transport all take as a queue name.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


@dataclass(frozen=True)
class Offer:
    """One accelerator the deployment runs, on its queue, and the most a run may ask of it.

    The maxima are what this version builds (`rl_core.spec.MAX_HOSTS_BUILT`): an operator
    cannot offer more than the code can run, or a run would be accepted and run on less.
    """

    accelerator: str
    queue: str
    max_hosts: int = MAX_HOSTS_BUILT
    max_rollout_servers: int = MAX_ROLLOUT_SERVERS_BUILT


@dataclass(frozen=True)
class Routes:
    offers: tuple[Offer, ...]  # in the operator's order
    default: str  # the accelerator of a spec that names none; one of the offers

    @property
    def accelerators(self) -> tuple[str, ...]:
        return tuple(o.accelerator for o in self.offers)

    def offer(self, accelerator: str | None) -> Offer | None:
        wanted = accelerator or self.default
        return next((o for o in self.offers if o.accelerator == wanted), None)

    def queue_of(self, accelerator: str | None) -> str | None:
        """The queue of ``accelerator`` (None: the default's, for a run stored before runs
        had one); None when the deployment no longer offers it."""
        offer = self.offer(accelerator)
        return None if offer is None else offer.queue

    def admit(self, resources: ResourcesSpec) -> str:
        """The accelerator a run with these resources goes to; `Unprocessable` naming the
        field when the deployment does not offer what it asks."""
        offer = self.offer(resources.accelerator)
        if offer is None:
            raise Unprocessable(
                f"resources.accelerator: this deployment offers {_listed(self.accelerators)}, "
                f"not {resources.accelerator}; ask for one of those (GET /v1/limits lists "
                "them), or leave the field out for the default "
                f"({self.default})",
                field="spec.resources.accelerator",
            )
        if resources.hosts > offer.max_hosts:
            raise Unprocessable(
                f"resources.hosts: {resources.hosts} hosts asked for, but this deployment "
                f"trains a run on at most {offer.max_hosts} {offer.accelerator} trainer "
                f"processes; ask for at most {offer.max_hosts}",
                field="spec.resources.hosts",
            )
        if resources.rollout_servers > offer.max_rollout_servers:
            raise Unprocessable(
                f"resources.rollout_servers: {resources.rollout_servers} rollout servers asked "
                f"for, but this deployment gives a run at most {offer.max_rollout_servers}; "
                f"ask for at most {offer.max_rollout_servers}",
                field="spec.resources.rollout_servers",
            )
        return offer.accelerator

    @classmethod
    def parse(cls, queues: str | None, task_queue: str | None, default: str | None) -> Routes:
        """The routes the settings declare; `ValueError` naming the variable at fault."""
        if default is not None and default not in ACCELERATORS:
            raise ValueError(
                f"RLAAS_DEFAULT_ACCELERATOR is {default!r}; it is one of {_listed(ACCELERATORS)}"
            )
        if queues is None:
            queue = _queue_name(task_queue or "cpu", "RLAAS_TASK_QUEUE")
            accelerator = queue if queue in ACCELERATORS else (default or "cpu")
            if default is not None and default != accelerator:
                raise ValueError(
                    f"RLAAS_DEFAULT_ACCELERATOR is {default}, but RLAAS_TASK_QUEUE {queue!r} is "
                    f"the queue of {accelerator}; to offer several accelerators, set "
                    "RLAAS_QUEUES (cpu=<queue>,gpu=<queue>) instead of RLAAS_TASK_QUEUE"
                )
            return cls(offers=(Offer(accelerator, queue),), default=accelerator)
        if task_queue is not None:
            raise ValueError(
                "RLAAS_QUEUES and RLAAS_TASK_QUEUE are both set; RLAAS_QUEUES replaces it: "
                "unset RLAAS_TASK_QUEUE"
            )
        offers = tuple(_offer(item) for item in queues.split(",") if item.strip())
        if not offers:
            raise ValueError(
                "RLAAS_QUEUES is empty; set it as accelerator=queue pairs, e.g. "
                "cpu=rlaas-cpu,gpu=rlaas-gpu"
            )
        for seen, offer in enumerate(offers):
            for other in offers[:seen]:
                if offer.accelerator == other.accelerator:
                    raise ValueError(f"RLAAS_QUEUES names {offer.accelerator} twice")
                if offer.queue == other.queue:
                    # A worker serves one accelerator: a queue of two would hand it runs
                    # it cannot run.
                    raise ValueError(
                        f"RLAAS_QUEUES gives {other.accelerator} and {offer.accelerator} the "
                        f"same queue {offer.queue!r}; each accelerator needs its own"
                    )
        routes = cls(offers=offers, default=default or offers[0].accelerator)
        if default is not None and routes.offer(default) is None:
            raise ValueError(
                f"RLAAS_DEFAULT_ACCELERATOR is {default}, which RLAAS_QUEUES does not offer "
                f"({_listed(routes.accelerators)})"
            )
        return routes


def _offer(item: str) -> Offer:
    accelerator, sep, queue = (part.strip() for part in item.partition("="))
    if not sep:
        raise ValueError(
            f"RLAAS_QUEUES has {item.strip()!r}; each entry is accelerator=queue, e.g. "
            "cpu=rlaas-cpu"
        )
    if accelerator not in ACCELERATORS:
        raise ValueError(
            f"RLAAS_QUEUES names the accelerator {accelerator!r}; "
            f"the accelerators are {_listed(ACCELERATORS)}"
        )
    return Offer(accelerator, _queue_name(queue, "RLAAS_QUEUES"))


def _queue_name(queue: str, variable: str) -> str:
    if not _QUEUE_NAME.fullmatch(queue):
        raise ValueError(
            f"{variable} has the queue name {queue!r}; a queue name is letters, digits and "
            "._:- (at most 200), starting with a letter or digit"
        )
    return queue


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names)

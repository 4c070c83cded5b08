"""A run's trainer over ``resources.hosts`` processes: what each process builds, and the group.

The process that runs the pipeline (a worker, `rlaas train`) never joins the trainer's
collectives: it starts K trainer processes through a `StartHosts` it is given (Ray
actors in a placement group on a worker: worker/trainer_hosts.py), each of which builds
the run's `Trainer` with `spec_trainer` over the global mesh, and talks to them through a
`TrainerGroup`. Each process loads the model from the spec's source itself (the same
seed, the same file: hf:/gguf: sources must be readable on every host), so no weights
travel at the start.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from rl_core.errors import UnsupportedSpec
from rl_core.spec import JobSpec
from rl_core.training.trainer import Trainer, TrainerConfig
from rl_core.training.trainer_group import TrainerGroup, TrainerHosts

# (K, factory) -> K started processes, each building its trainer with ``factory(mesh)``
# (picklable: it crosses into the processes).
StartHosts = Callable[[int, Callable[[Any], Trainer]], TrainerHosts]


def spec_trainer(spec_json: str, mesh: Any) -> Trainer:
    """The run's trainer in one trainer process, its weights replicated on ``mesh``."""
    from flax import nnx

    from rl_core.pipeline import configs
    from rl_core.pipeline.initial import initial_adapters
    from rl_core.pretrained.sources import load_model
    from rl_core.spec import parse_spec
    from rl_core.training.spmd import replicated

    spec = parse_spec(json.loads(spec_json))
    model, _ = load_model(spec.model, seed=spec.train.seed)
    nnx.update(model, replicated(nnx.state(model), mesh))
    config = configs.trainer_config(spec)
    return Trainer(model, config, initial_adapters=initial_adapters(spec, model, config))


def check_hosts(spec: JobSpec, start: StartHosts | None) -> None:
    """A multi-host run needs a way to start its processes: refused before any work
    without one. (The spec itself checks that its rows split over them.)"""
    hosts = spec.resources.hosts
    if start is None:
        raise UnsupportedSpec(
            "resources.hosts",
            f"{hosts} trainer processes asked for, and this process has no way to start "
            "them: run it on an rlaas worker (Ray starts them) or with `rlaas train`, or "
            "set resources.hosts to 1",
        )


def trainer_group(spec: JobSpec, config: TrainerConfig, start: StartHosts | None) -> TrainerGroup:
    """The run's trainer over ``spec.resources.hosts`` processes started by ``start``."""
    check_hosts(spec, start)
    assert start is not None
    factory = functools.partial(spec_trainer, spec.model_dump_json())
    return TrainerGroup(start(spec.resources.hosts, factory), config)


__all__ = ["StartHosts", "check_hosts", "spec_trainer", "trainer_group"]

"""The adapters a run starts from (``model.lora.init_from``), read in the trainer's process:
the pipeline's (`rl_core.pipeline.build`) or each trainer process's
(`rl_core.pipeline.hosted`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core.models import Model
from rl_core.spec import JobSpec
from rl_core.training.trainer import TrainerConfig


def initial_adapters(spec: JobSpec, model: Model, config: TrainerConfig) -> Any:
    """The adapters ``model.lora.init_from`` names, checked against the base; None without.

    rl_core reads a folder (``file:``) only: a service resolves ``run:`` to the folder of
    that checkpoint's PEFT export before the run reaches here (worker/init_from.py). On a
    resumed attempt they are read again: the checkpoint's adapters replace them as the
    policy, and they stay its KL reference.
    """
    lora = spec.model.lora
    if lora is None or lora.init_from is None:
        return None
    from rl_core.spec import parse_init_from
    from rl_core.training.adapter_init import AdapterMismatch
    from rl_core.training.adapter_init import initial_adapters as read_adapters

    kind, location, _ = parse_init_from(lora.init_from)
    if kind != "file":
        raise AdapterMismatch(
            f"{lora.init_from!r} names a run or an upload of the rlaas service; with rlaas "
            "train on your machine give the adapter's folder (file:<dir>: a run's "
            "exports/step-N/peft, or a folder PEFT saved)"
        )
    from flax import nnx

    assert config.lora is not None  # the spec's model.lora
    params = nnx.state(model, nnx.Param)
    return read_adapters(Path(location).expanduser(), params, config.lora)


__all__ = ["initial_adapters"]

"""The spec's ``resources``: defaults that keep every spec meaning what it did, the rules
it holds by itself, and the run's refusal of what this version does not build."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest

from rl_core.errors import UnsupportedSpec
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.build import check_resources
from rl_core.pipeline.runner import train
from rl_core.spec import (
    MAX_HOSTS_BUILT,
    MAX_ROLLOUT_SERVERS_BUILT,
    ResourcesSpec,
    SpecError,
    load_spec,
    parse_spec,
)

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def spec_with(resources: dict[str, object], **sections: object) -> dict[str, object]:
    return {"environment": {"name": "guess_number"}, "resources": resources, **sections}


def problems_of(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.problems


def test_a_spec_without_resources_asks_for_the_deployments_default_one_host_one_engine() -> None:
    resources = parse_spec({"environment": {"name": "guess_number"}}).resources
    assert resources == ResourcesSpec(accelerator=None, hosts=1, rollout_servers=1)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_keeps_the_default_resources(path: Path) -> None:
    assert load_spec(path).resources == ResourcesSpec()


@pytest.mark.parametrize("accelerator", ["cpu", "gpu", "tpu"])
def test_each_accelerator_class_is_accepted(accelerator: str) -> None:
    assert parse_spec(spec_with({"accelerator": accelerator})).resources.accelerator == accelerator


@pytest.mark.parametrize(
    ("resources", "field", "reason"),
    [
        ({"accelerator": "fpga"}, "resources.accelerator", "'cpu', 'gpu' or 'tpu'"),
        ({"accelerator": "GPU"}, "resources.accelerator", "'cpu', 'gpu' or 'tpu'"),
        ({"hosts": 0}, "resources.hosts", "greater than or equal to 1"),
        ({"hosts": -2}, "resources.hosts", "greater than or equal to 1"),
        ({"hosts": 1.5}, "resources.hosts", "valid integer"),
        ({"rollout_servers": 0}, "resources.rollout_servers", "greater than or equal to 1"),
        ({"rollout_servers": 5000}, "resources.rollout_servers", "less than or equal to 1024"),
        ({"gpus": 8}, "resources.gpus", "Extra inputs"),
    ],
)
def test_bad_resources_name_the_field(
    resources: dict[str, object], field: str, reason: str
) -> None:
    problems = problems_of(spec_with(resources))
    assert any(p.startswith(f"{field}:") and reason in p for p in problems), problems


def test_several_rollout_servers_need_vllm_servers() -> None:
    (problem,) = problems_of(spec_with({"rollout_servers": 2}))
    assert "resources.rollout_servers: 2 servers need rollout.engine: vllm" in problem
    assert parse_spec(spec_with({"rollout_servers": 2}, rollout={"engine": "vllm"}))
    # One URL is one server: a fleet is started by the run, not named by one address.
    one_url = {"engine": "vllm", "vllm_url": "http://127.0.0.1:8000"}
    (problem,) = problems_of(spec_with({"rollout_servers": 2}, rollout=one_url))
    assert "resources.rollout_servers: 2 servers, but rollout.vllm_url names one" in problem


def test_the_batch_splits_evenly_over_the_trainer_processes() -> None:
    rows = {"algorithm": {"batch_groups": 3}, "rollout": {"group_size": 2}}  # 6 rows
    (problem,) = problems_of(spec_with({"hosts": 4}, **rows))
    assert "resources.hosts: the batch's 6 rows" in problem, problem
    assert "do not split evenly over 4 trainer processes" in problem
    assert parse_spec(spec_with({"hosts": 3}, **rows)).resources.hosts == 3


def test_the_run_refuses_more_hosts_or_servers_than_are_built() -> None:
    over = MAX_HOSTS_BUILT + 1
    hosts = parse_spec(spec_with({"hosts": over}, algorithm={"batch_groups": over}))
    with pytest.raises(UnsupportedSpec) as info:
        check_resources(hosts, backend="cpu")
    assert info.value.field == "resources.hosts"
    assert f"spans at most {MAX_HOSTS_BUILT} processes" in str(info.value)
    servers = parse_spec(
        spec_with({"rollout_servers": MAX_ROLLOUT_SERVERS_BUILT + 1}, rollout={"engine": "vllm"})
    )
    with pytest.raises(UnsupportedSpec) as info:
        check_resources(servers, backend="cpu")
    assert info.value.field == "resources.rollout_servers"


def test_the_run_refuses_an_accelerator_its_jax_does_not_run_on() -> None:
    gpu = parse_spec(spec_with({"accelerator": "gpu"}))
    with pytest.raises(UnsupportedSpec) as info:
        check_resources(gpu)  # this machine's JAX: CPU only
    assert jax.default_backend() == "cpu"
    assert info.value.field == "resources.accelerator"
    assert "asks for gpu, but JAX runs on cpu here" in str(info.value)
    assert "RLAAS_QUEUES" in str(info.value)
    check_resources(gpu, backend="gpu")  # a GPU worker: CUDA and ROCm are both "gpu"
    check_resources(parse_spec(spec_with({"accelerator": "cpu"})))
    # Naming none runs on whatever the process has, as every run did before.
    check_resources(parse_spec(spec_with({})), backend="tpu")


@pytest.mark.parametrize(
    ("resources", "field"),
    [({"hosts": 2}, "resources.hosts"), ({"accelerator": "tpu"}, "resources.accelerator")],
)
def test_train_refuses_before_any_work(resources: dict[str, object], field: str) -> None:
    """`rlaas train` (no API in front) is refused too, never run on less than asked."""
    sink = MemorySink()
    with pytest.raises(UnsupportedSpec) as info:
        train(parse_spec(spec_with(resources)), sink=sink)
    assert info.value.field == field
    assert sink.steps == [] and sink.checkpoints == []

"""What the operator declares a deployment offers (RLAAS_QUEUES and the settings before it),
checked at start-up with the variable named, and what a spec may ask of it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.errors import Unprocessable
from app.routing import Offer, Routes
from app.settings import Settings
from rl_core.spec import MAX_HOSTS_BUILT, MAX_ROLLOUT_SERVERS_BUILT, ResourcesSpec


def routes(**env: str) -> Routes:
    return Settings(**env).routes()  # type: ignore[arg-type]


def test_unset_is_todays_one_cpu_queue() -> None:
    assert routes() == Routes(offers=(Offer("cpu", "cpu"),), default="cpu")


def test_the_task_queue_alone_is_one_accelerator_as_before() -> None:
    # Named after an accelerator: that one's queue.
    assert routes(task_queue="gpu") == Routes(offers=(Offer("gpu", "gpu"),), default="gpu")
    # Any other name: the default accelerator's (cpu unless said).
    assert routes(task_queue="runs") == Routes(offers=(Offer("cpu", "runs"),), default="cpu")
    tpu = routes(task_queue="pod-7", default_accelerator="tpu")
    assert tpu == Routes(offers=(Offer("tpu", "pod-7"),), default="tpu")


def test_queues_map_each_accelerator_and_the_first_is_the_default() -> None:
    mixed = routes(queues=" gpu = rlaas-gpu , cpu=rlaas-cpu,")
    assert mixed.offers == (Offer("gpu", "rlaas-gpu"), Offer("cpu", "rlaas-cpu"))
    assert mixed.default == "gpu" and mixed.accelerators == ("gpu", "cpu")
    assert mixed.queue_of("cpu") == "rlaas-cpu" and mixed.queue_of(None) == "rlaas-gpu"
    assert mixed.queue_of("tpu") is None  # not offered: not sent (app.dispatch logs it)
    said = routes(queues="gpu=rlaas-gpu,cpu=rlaas-cpu", default_accelerator="cpu")
    assert said.default == "cpu" and said.queue_of(None) == "rlaas-cpu"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"queues": "fpga=q"}, "RLAAS_QUEUES names the accelerator 'fpga'"),
        ({"queues": "cpu"}, "RLAAS_QUEUES has 'cpu'; each entry is accelerator=queue"),
        ({"queues": " , "}, "RLAAS_QUEUES is empty"),
        ({"queues": "cpu=a,cpu=b"}, "RLAAS_QUEUES names cpu twice"),
        ({"queues": "cpu=q,gpu=q"}, "RLAAS_QUEUES gives cpu and gpu the same queue 'q'"),
        ({"queues": "cpu=a b"}, "RLAAS_QUEUES has the queue name 'a b'"),
        ({"queues": "cpu="}, "RLAAS_QUEUES has the queue name ''"),
        ({"task_queue": "-x"}, "RLAAS_TASK_QUEUE has the queue name '-x'"),
        ({"queues": "cpu=a", "task_queue": "b"}, "RLAAS_QUEUES and RLAAS_TASK_QUEUE are both"),
        ({"queues": "cpu=a", "default_accelerator": "gpu"}, "RLAAS_DEFAULT_ACCELERATOR is gpu"),
        ({"default_accelerator": "npu"}, "RLAAS_DEFAULT_ACCELERATOR is 'npu'"),
        ({"task_queue": "gpu", "default_accelerator": "cpu"}, "RLAAS_TASK_QUEUE 'gpu' is the"),
        ({"queues": "cpu=serve"}, "RLAAS_SERVE_QUEUE 'serve' is also a run queue"),
    ],
)
def test_a_bad_setting_stops_start_up_naming_the_variable(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**env)  # type: ignore[arg-type]
    assert says in str(info.value), str(info.value)


def test_the_environment_is_read_as_an_operator_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLAAS_QUEUES", "cpu=rlaas-cpu,tpu=rlaas-tpu")
    monkeypatch.setenv("RLAAS_DEFAULT_ACCELERATOR", "tpu")
    assert Settings().routes().queue_of(None) == "rlaas-tpu"
    monkeypatch.setenv("RLAAS_TASK_QUEUE", "cpu")
    with pytest.raises(ValidationError, match="unset RLAAS_TASK_QUEUE"):
        Settings()


def test_admit_names_what_the_deployment_lacks() -> None:
    mixed = routes(queues="cpu=rlaas-cpu,gpu=rlaas-gpu")
    assert mixed.admit(ResourcesSpec()) == "cpu"
    assert mixed.admit(ResourcesSpec(accelerator="gpu")) == "gpu"
    with pytest.raises(Unprocessable) as info:
        mixed.admit(ResourcesSpec(accelerator="tpu"))
    assert info.value.field == "spec.resources.accelerator"
    assert "offers cpu, gpu, not tpu" in info.value.message
    assert mixed.admit(ResourcesSpec(hosts=2)) == "cpu"
    with pytest.raises(Unprocessable) as info:
        mixed.admit(ResourcesSpec(hosts=MAX_HOSTS_BUILT + 1))
    assert info.value.field == "spec.resources.hosts"
    assert f"ask for at most {MAX_HOSTS_BUILT}" in info.value.message
    over = MAX_ROLLOUT_SERVERS_BUILT + 1
    with pytest.raises(Unprocessable) as info:
        mixed.admit(ResourcesSpec(rollout_servers=over))
    assert info.value.field == "spec.resources.rollout_servers"
    assert f"ask for at most {MAX_ROLLOUT_SERVERS_BUILT}" in info.value.message

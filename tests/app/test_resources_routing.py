"""One API, several accelerators: each run is sent to its accelerator's queue, at submit
and every time after (a lost lease's re-queue, a stranded run's redispatch), on real
PostgreSQL and a real Redis broker read back with its own client; a spec asking for what
the deployment lacks is a 422 naming the field; a worker's claim stays in its queue's
accelerator."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import func, select, update

from app.db.models import Run, utcnow
from app.dispatch import CeleryDispatcher
from app.main import reap_once
from tests.app.conftest import Api, running_api, spec

pytestmark = pytest.mark.anyio


@dataclass
class Broker:
    url: str
    client: redis.Redis[bytes]
    prefix: str  # this test's queues: <prefix>-cpu, <prefix>-gpu

    def queue(self, accelerator: str) -> str:
        return f"{self.prefix}-{accelerator}"

    def take(self, accelerator: str) -> list[str]:
        """The run ids of the messages on the accelerator's queue, which are removed."""
        name = self.queue(accelerator)
        raw = self.client.lrange(name, 0, -1)
        self.client.delete(name)
        return [run_id_of(m) for m in reversed(raw)]  # kombu pushes on the left


def run_id_of(raw: bytes) -> str:
    message = json.loads(raw)
    assert message["headers"]["task"] == "rlaas.run_job"
    body = json.loads(base64.b64decode(message["body"]))
    return str(body[0][0])  # (args, kwargs, embed)


@pytest.fixture
def broker(redis_url: str) -> Iterator[Broker]:
    # A database no other test flushes, and queue names of this test's own (xdist).
    url = redis_url.rsplit("/", 1)[0] + "/8"
    client = redis.Redis.from_url(url)
    found = Broker(url, client, f"rt-{uuid.uuid4().hex[:10]}")
    yield found
    for accelerator in ("cpu", "gpu", "tpu"):
        client.delete(found.queue(accelerator))
    client.close()


@pytest.fixture
async def mixed(app_database: str, broker: Broker) -> AsyncIterator[Api]:
    """One API offering cpu (the default: listed first) and gpu, each on its queue,
    publishing through the real Celery producer."""
    queues = f"cpu={broker.queue('cpu')},gpu={broker.queue('gpu')}"
    async with running_api(
        app_database, dispatcher=CeleryDispatcher(broker.url), queues=queues
    ) as api:
        yield api


async def post(api: Api, auth: dict[str, str], **sections: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/runs", json={"spec": spec(**sections)}, headers=auth)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_each_run_is_sent_to_its_accelerators_queue(mixed: Api, broker: Broker) -> None:
    auth = await mixed.tenant()
    gpu = await post(mixed, auth, resources={"accelerator": "gpu"})
    cpu = await post(mixed, auth, resources={"accelerator": "cpu"})
    # A spec from before resources existed: the default accelerator, as every run was.
    before = await post(mixed, auth)
    assert broker.take("gpu") == [gpu["id"]]
    assert broker.take("cpu") == [cpu["id"], before["id"]]
    assert (gpu["accelerator"], cpu["accelerator"], before["accelerator"]) == ("gpu", "cpu", "cpu")
    # The spec is stored as it was asked: "the default" stays the default.
    assert before["spec"]["resources"] == {"accelerator": None, "hosts": 1, "rollout_servers": 1}
    limits = (await mixed.client.get("/v1/limits", headers=auth)).json()["resources"]
    assert limits == {
        "accelerators": [
            {"accelerator": "cpu", "max_hosts": 8, "max_rollout_servers": 8},
            {"accelerator": "gpu", "max_hosts": 8, "max_rollout_servers": 8},
        ],
        "default_accelerator": "cpu",
    }


@pytest.mark.parametrize(
    ("sections", "field", "says"),
    [
        (
            {"resources": {"accelerator": "tpu"}},
            "spec.resources.accelerator",
            "this deployment offers cpu, gpu, not tpu",
        ),
        (
            {"resources": {"hosts": 9}, "algorithm": {"batch_groups": 9}},  # 9 x 8 rows
            "spec.resources.hosts",
            "at most 8 cpu trainer processes; ask for at most 8",
        ),
        (
            {"resources": {"rollout_servers": 9}, "rollout": {"engine": "vllm"}},
            "spec.resources.rollout_servers",
            "gives a run at most 8; ask for at most 8",
        ),
        (
            {"resources": {"rollout_servers": 2}},  # the spec's own rule, across sections
            "spec.resources.rollout_servers",
            "2 servers need rollout.engine: vllm",
        ),
        ({"resources": {"hosts": 0}}, "spec.resources.hosts", "greater than or equal to 1"),
    ],
)
async def test_what_the_deployment_lacks_is_422_naming_the_field(
    mixed: Api, broker: Broker, sections: dict[str, Any], field: str, says: str
) -> None:
    auth = await mixed.tenant()
    r = await mixed.client.post("/v1/runs", json={"spec": spec(**sections)}, headers=auth)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field and says in error["message"], error
    assert await mixed.db(lambda s: s.scalar(select(func.count()).select_from(Run))) == 0
    assert broker.take("cpu") == broker.take("gpu") == []


async def test_a_requeued_or_stranded_run_goes_back_to_its_queue(
    mixed: Api, broker: Broker
) -> None:
    auth = await mixed.tenant()
    gpu = (await post(mixed, auth, resources={"accelerator": "gpu"}))["id"]
    assert broker.take("gpu") == [gpu]
    # Its worker dies: the lease runs out and the reaper queues it again.
    assert (await mixed.internal(gpu, "claim", worker_id="w1", fair=True)).status_code == 200
    past = utcnow() - timedelta(seconds=1)
    await mixed.db(
        lambda s: s.execute(update(Run).where(Run.id == gpu).values(lease_expires_at=past))
    )
    assert await reap_once(mixed.state) == [gpu]
    assert broker.take("gpu") == [gpu] and broker.take("cpu") == []
    # Still queued past redispatch_after_s (no GPU worker free): sent again, to the same queue.
    late = utcnow() - timedelta(seconds=mixed.state.settings.redispatch_after_s + 1)
    await mixed.db(lambda s: s.execute(update(Run).where(Run.id == gpu).values(updated_at=late)))
    await reap_once(mixed.state)
    assert broker.take("gpu") == [gpu] and broker.take("cpu") == []


async def test_a_run_stored_before_accelerators_goes_to_the_default(
    mixed: Api, broker: Broker
) -> None:
    auth = await mixed.tenant()
    old = (await post(mixed, auth))["id"]
    # As migration 0019 leaves a run submitted before it.
    await mixed.db(lambda s: s.execute(update(Run).where(Run.id == old).values(accelerator=None)))
    broker.take("cpu")
    late = utcnow() - timedelta(seconds=mixed.state.settings.redispatch_after_s + 1)
    await mixed.db(lambda s: s.execute(update(Run).where(Run.id == old).values(updated_at=late)))
    await reap_once(mixed.state)
    assert broker.take("cpu") == [old] and broker.take("gpu") == []
    # And a CPU worker's fair claim takes it.
    claim = await mixed.internal(old, "claim", worker_id="cpu-1", fair=True)
    assert claim.status_code == 200 and claim.json()["run_id"] == old


async def test_a_fair_claim_takes_a_run_of_its_messages_accelerator_only(mixed: Api) -> None:
    """Fair order would pick the idle tenant's CPU run first; a GPU worker (its message
    names a GPU run) takes the GPU run, and a CPU worker the CPU run."""
    busy, idle = await mixed.tenant(), await mixed.tenant()
    held = (await post(mixed, busy, resources={"accelerator": "gpu"}))["id"]
    assert (await mixed.internal(held, "claim", worker_id="gpu-0")).status_code == 200
    gpu = (await post(mixed, busy, resources={"accelerator": "gpu"}))["id"]
    cpu = (await post(mixed, idle))["id"]
    claim = await mixed.internal(gpu, "claim", worker_id="gpu-1", fair=True)
    assert claim.status_code == 200 and claim.json()["run_id"] == gpu
    # Nothing else of the GPU's is queued: a second GPU message finds nothing to take.
    again = await mixed.internal(gpu, "claim", worker_id="gpu-2", fair=True)
    assert again.status_code == 409, again.text
    claim = await mixed.internal(cpu, "claim", worker_id="cpu-1", fair=True)
    assert claim.status_code == 200 and claim.json()["run_id"] == cpu
    # A message naming no run here takes nothing (which queue it came off is unknown).
    lost = await mixed.internal("run_" + "0" * 32, "claim", worker_id="cpu-2", fair=True)
    assert lost.status_code == 409 and "names no run here" in lost.json()["error"]["message"]


async def test_the_task_queue_alone_still_routes_every_run_there(
    app_database: str, broker: Broker
) -> None:
    """A deployment configured before RLAAS_QUEUES: its one queue, its one accelerator."""
    async with running_api(
        app_database, dispatcher=CeleryDispatcher(broker.url), task_queue=broker.queue("gpu"),
        default_accelerator="gpu",
    ) as api:  # fmt: skip
        auth = await api.tenant()
        run = await post(api, auth)
        assert broker.take("gpu") == [run["id"]] and run["accelerator"] == "gpu"
        r = await api.client.post(
            "/v1/runs", json={"spec": spec(resources={"accelerator": "cpu"})}, headers=auth
        )
        assert r.status_code == 422 and "offers gpu, not cpu" in r.json()["error"]["message"]

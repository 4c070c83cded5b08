"""Request ids, JSON access logs and the Prometheus /metrics page."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.observability import JsonFormatter, RequestIdFilter
from tests.app.conftest import Api, running_api

pytestmark = pytest.mark.anyio


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The rlaas loggers' lines, formatted as in production, when they are emitted."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("rlaas")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


async def test_a_request_id_comes_back_and_is_made_when_missing_or_unsafe(api: Api) -> None:
    given = await api.client.get("/healthz", headers={"X-Request-ID": "trace-abc.123"})
    assert given.headers["X-Request-ID"] == "trace-abc.123"
    made = await api.client.get("/healthz")
    assert len(made.headers["X-Request-ID"]) == 32
    for unsafe in ("has spaces", "x" * 200, "new\\nline"):
        r = await api.client.get("/healthz", headers={"X-Request-ID": unsafe})
        assert r.headers["X-Request-ID"] != unsafe and len(r.headers["X-Request-ID"]) == 32
    assert len(r.headers.get_list("X-Request-ID")) == 1


async def test_the_access_log_is_json_with_the_request_id_route_and_tenant(
    api: Api, json_log: io.StringIO
) -> None:
    auth = await api.tenant()
    r = await api.client.get("/v1/runs/run_nope", headers={**auth, "X-Request-ID": "req-42"})
    assert r.status_code == 404
    (entry,) = [e for e in lines(json_log) if e.get("request_id") == "req-42"]
    assert entry["logger"] == "rlaas.access" and entry["level"] == "info"
    assert entry["route"] == "/v1/runs/{run_id}" and entry["path"] == "/v1/runs/run_nope"
    assert entry["status"] == 404 and entry["method"] == "GET"
    assert str(entry["tenant_id"]).startswith("ten_")
    assert isinstance(entry["duration_ms"], float)
    assert "Authorization" not in json_log.getvalue() and "rlaas_" not in json_log.getvalue()


async def test_lines_logged_inside_a_request_carry_its_id(api: Api, json_log: io.StringIO) -> None:
    # The lease reaper logs per run it re-enqueues; a route that logs shows the same:
    # the id is taken from the context when the line is emitted.
    logging.getLogger("rlaas.test").info("outside any request")
    r = await api.client.get("/healthz", headers={"X-Request-ID": "req-7"})
    assert r.status_code == 200
    by_msg = {str(e["msg"]): e for e in lines(json_log)}
    assert by_msg["outside any request"]["request_id"] is None
    assert by_msg["GET /healthz 200"]["request_id"] == "req-7"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


async def test_metrics_count_requests_by_route_template_runs_by_status_and_ingest(
    api: Api,
) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.submit(auth)
    for _ in range(2):
        await api.client.get("/v1/runs/run_missing", headers=auth)
    await api.client.get("/no/such/path")
    await api.internal(run_id, "claim", worker_id="w")
    points = [{"step": 1, "name": "loss", "value": 1.0}]
    for seq in (0, 0):
        await api.internal(run_id, "metrics", worker_id="w", seq=seq, points=points)

    r = await api.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = samples(r.text)
    route = ("route", "/v1/runs/{run_id}")
    assert got[("rlaas_http_requests_total", (("method", "GET"), route, ("status", "404")))] == 2
    assert (
        got[
            (
                "rlaas_http_requests_total",
                (("method", "GET"), ("route", "<unmatched>"), ("status", "404")),
            )
        ]
        == 1
    )
    assert got[("rlaas_http_request_duration_seconds_count", (("method", "GET"), route))] == 2
    assert got[("rlaas_runs", (("status", "queued"),))] == 1
    assert got[("rlaas_runs", (("status", "starting"),))] == 1
    assert got[("rlaas_runs", (("status", "failed"),))] == 0
    assert got[("rlaas_ingest_batches_total", (("kind", "metrics"), ("status", "200")))] == 2
    # The second batch repeated the first's seq: one point stored, one duplicate counted.
    assert got[("rlaas_ingest_items_total", (("kind", "metrics"),))] == 1
    assert got[("rlaas_ingest_duplicate_batches_total", (("kind", "metrics"),))] == 1
    assert not any("run_missing" in str(labels) for _, labels in got)  # no raw ids as labels


async def test_metrics_answer_loopback_only_or_the_operators_token(app_database: str) -> None:
    """GET /metrics is the operator's: a client on another host is refused unless it
    brings RLAAS_METRICS_TOKEN; with the token set, loopback needs it too."""
    async with running_api(app_database) as api:
        assert (await api.client.get("/metrics")).status_code == 200  # ASGI client: 127.0.0.1
        remote = httpx.ASGITransport(app=api.app, client=("203.0.113.9", 40000))
        async with httpx.AsyncClient(transport=remote, base_url="http://rlaas.test") as outside:
            r = await outside.get("/metrics")
            assert r.status_code == 403 and "RLAAS_METRICS_TOKEN" in r.json()["error"]["message"]
    async with running_api(app_database, metrics_token="scrape-me") as api:
        assert (await api.client.get("/metrics")).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await api.client.get("/metrics", headers=wrong)).status_code == 401
        right = {"Authorization": "Bearer scrape-me"}
        r = await api.client.get("/metrics", headers=right)
        assert r.status_code == 200 and "rlaas_http_requests_total" in r.text

"""The Celery producer, against a real Redis and the embedded SQLite broker."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import redis
from kombu.transport import sqlalchemy as sqla_transport

from app.dispatch import TASK_RUN_JOB, CeleryDispatcher


def decode(raw: bytes | str) -> tuple[dict[str, Any], Any]:
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return message["headers"], json.loads(body)


def test_a_run_is_sent_by_task_name_to_the_cpu_queue_on_redis(redis_url: str) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/9"  # a database of its own
    client = redis.Redis.from_url(url)
    client.flushdb()
    dispatcher = CeleryDispatcher(url)
    try:
        dispatcher.dispatch("run_abc", "cpu")
    finally:
        dispatcher.close()
    messages = client.lrange("cpu", 0, -1)
    assert len(messages) == 1
    headers, body = decode(messages[0])
    assert headers["task"] == TASK_RUN_JOB == "rlaas.run_job"
    assert body[0] == ["run_abc"]  # (args, kwargs, embed): the id only, never the object


def test_the_embedded_broker_polls_quickly_and_stores_the_message(tmp_path: Path) -> None:
    broker = tmp_path / "broker.db"
    dispatcher = CeleryDispatcher(f"sqla+sqlite:///{broker}")
    try:
        assert sqla_transport.Transport.polling_interval == 0.25
        dispatcher.dispatch("run_embedded", "cpu")
    finally:
        dispatcher.close()
    with sqlite3.connect(broker) as conn:
        (payload,) = conn.execute("SELECT payload FROM kombu_message").fetchone()
        (queue,) = conn.execute("SELECT name FROM kombu_queue").fetchone()
    headers, body = decode(payload)
    assert queue == "cpu" and headers["task"] == "rlaas.run_job" and body[0] == ["run_embedded"]

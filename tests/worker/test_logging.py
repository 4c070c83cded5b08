"""At the worker's logging configuration, HTTP requests write no INFO lines.

A run makes thousands of requests (environment calls, heartbeats, report
batches); a line for each buried the worker's log (issue #20). The check runs
in a child process: Celery's logging set-up changes the root logger for good.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, json, logging, sys

import httpx

from rl_core.envs import Action
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from sdk.envserver import EnvServer
from tests.sdk.serving import SECRET, Scripted, serving
from worker.celery_app import app, quiet_http_clients

if sys.argv[1] == "unquieted":  # the control: what the worker logged before
    from celery.signals import after_setup_logger
    after_setup_logger.disconnect(quiet_http_clients)
# What `rlaas worker` (celery worker --loglevel INFO) does to logging before a task runs.
app.log.setup(logging.INFO, None, redirect_stdouts=False)
seen = []

class Keep(logging.Handler):
    def emit(self, record):
        seen.append([record.name, record.levelname, record.getMessage()])

logging.getLogger().addHandler(Keep())


async def episode(url):
    env = WebhookEnvironment(WebhookTarget(id="env_t", url=url, secret=SECRET))
    await env.reset("e", 0, {})
    await env.step("e", 1, Action(content="x"))
    await env.close("e")
    await env.aclose()


with serving(EnvServer(Scripted(), secret=SECRET).app) as url:
    asyncio.run(episode(url))
    httpx.get(f"{url}/healthz")  # the worker's control-plane client is httpx
logging.getLogger("worker.job").info("an INFO line of the worker's own")
print(json.dumps(seen))
"""


def records(mode: str) -> list[list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen: list[list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return seen


def test_a_webhook_episode_at_the_workers_logging_writes_no_info_line() -> None:
    seen = records("worker")
    # The worker's own INFO lines still get through: the configuration is the worker's.
    assert ["worker.job", "INFO", "an INFO line of the worker's own"] in seen
    others = [r for r in seen if r[0] != "worker.job"]
    assert others == [], others


def test_without_the_quieting_httpx_writes_a_line_per_request() -> None:
    """The control: the check above would see the lines if they were written."""
    seen = records("unquieted")
    assert any(name == "httpx" and level == "INFO" for name, level, _ in seen), seen

"""The dashboard in headless Chromium, against the control plane on loopback.

A run is fed through /internal exactly as a worker feeds it (claim, status,
numbered batches of metrics, spans and trajectories, a heartbeat with the
in-flight snapshot); the page must show it: the run in the list, a reward curve
that grows live over the stream, the stage timeline, a trajectory with its
trained tokens highlighted, what the run waits on, and the end of the run. A
screenshot is kept in tests-artifacts/.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page

from tests.web.browser import chromium
from tests.web.live import REPO, LiveApi, Worker
from tests.web.proxy import cutting_proxy

ARTIFACTS = REPO / "tests-artifacts"
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"


def step_metrics(step: int) -> dict[str, float]:
    held_out = (
        {
            "eval/reward_mean": 0.3 * step,
            "eval/solved": 0.1 * step,
            "eval/used_tool": 0.2 * step,
            "eval/pass@1": 0.05 * step,
            "eval/pass@4": 0.15 * step,
        }
        if step % 2 == 0
        else {}
    )
    return held_out | {
        "reward/mean": 0.1 * step,
        "reward/min": 0.05 * step,
        "reward/max": 0.2 * step,
        "loss": 1.0 / step,
        "kl": 0.01 * step,
        "staleness/max": float(step % 2),
        "tokens_per_s": 500.0 + step,
        "trajectories_per_s": 4.0,
        "time/rollout_s": 0.8,
        "time/train_s": 0.3,
        "trainer/busy_frac": 0.4,
        "trainer/blocked_frac": 0.5,
        "engine/busy_frac": 0.9,
    }


def spans(step: int, t0_us: int) -> list[dict[str, Any]]:
    base = t0_us + step * 1_000_000
    out = [
        {
            "name": "train_step",
            "start_us": base + 800_000,
            "dur_us": 150_000,
            "track": "trainer",
            "step": step,
        },
    ]
    for e in range(3):
        track = f"episode/s{step}-g0-e{e}"
        out.append(
            {
                "name": "rollout",
                "start_us": base + e * 50_000,
                "dur_us": 600_000,
                "track": track,
                "step": step - 1,
            }
        )
        out.append(
            {
                "name": "model_call",
                "start_us": base + e * 50_000,
                "dur_us": 200_000,
                "track": track,
                "step": step - 1,
            }
        )
    return out


def trajectory(run_id: str, step: int) -> dict[str, Any]:
    return {
        "episode_id": f"{run_id}~s{step}-g0-e0",
        "step": step,
        "policy_version": step - 1,
        "group": 0,
        "reward": 1.0,
        "turns": 2,
        "end_state": "done",
        "end_reason": None,
        "model_tokens": 6,
        "total_tokens": 40,
        "duration_s": 0.7,
        "segments": [
            {"text": f"user: guess my number {HOSTILE}\n", "trained": False},
            {"text": "assistant: 5", "trained": True},
            {"text": "\nuser: higher\n", "trained": False},
            {"text": "assistant: 8", "trained": True},
        ],
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
        "info": {},
    }


def feed(worker: Worker, run_id: str, steps: range, t0_us: int) -> None:
    for step in steps:
        worker.step(step, step_metrics(step))
    worker.spans([s for step in steps for s in spans(step, t0_us)])
    worker.trajectories([trajectory(run_id, steps[-1])])


def wait_js(page: Page, expression: str, what: str, timeout_s: float = 20) -> None:
    try:
        # A function, not an expression: the page's CSP (rightly) refuses eval of a string.
        page.wait_for_function(f"() => ({expression})", timeout=timeout_s * 1000)
    except Exception as exc:
        banner = page.locator("#page-error").inner_text()
        raise AssertionError(
            f"the page never showed {what} ({expression}); its error banner: {banner!r}"
        ) from exc


def test_dashboard_shows_a_live_run(live: LiveApi, tmp_path: Path) -> None:
    key = live.tenant()
    auth = {"Authorization": f"Bearer {key}"}
    spec = {"environment": {"name": "guess_number"}, "train": {"steps": 6}}
    created = httpx.post(
        f"{live.url}/v1/runs", json={"spec": spec, "name": "browser-demo"}, headers=auth
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    worker = live.worker(run_id)
    worker.start()
    t0_us = int(time.time() * 1e6) - 20_000_000  # inside the page's "last 2 minutes"
    feed(worker, run_id, range(1, 5), t0_us)
    worker.heartbeat(
        {
            "step": 4,
            "trainer": "waiting_for_trajectories",
            "trainer_since_s": 1.5,
            "queue_depth": 0,
            "episodes": [
                {
                    "episode_id": f"{run_id}~s5-g0-e2",
                    "stage": "env_step",
                    "since_s": 42.0,
                    "turn": 1,
                }
            ],
        }
    )

    worker.post("artifacts", kind="checkpoint", step=4, uri="file:///ckpt/step-4", size_bytes=10)

    errors: list[str] = []
    with chromium(tmp_path / "profile") as browser:
        page = browser.pages[0] if browser.pages else browser.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        # The quickstart's link: the key in the fragment, taken once and dropped from it.
        page.goto(f"{live.url}/#key={key}")
        row = page.locator(f'tr.run-row[data-run-id="{run_id}"]')
        row.wait_for(timeout=20_000)
        assert "running" in row.inner_text() and "browser-demo" in row.inner_text()
        assert "key=" not in page.url
        assert page.evaluate("localStorage.getItem('rlaas.apiKey')") == key

        row.locator("a").click()
        reward = "document.getElementById('chart-reward')"
        wait_js(
            page,
            f"{reward}.data && {reward}.data.some(t => t.name === 'reward/mean' "
            "&& t.x.length === 4)",
            "4 reward points",
        )
        # Drawn, not just handed to plotly: the line's SVG path is there.
        assert page.locator("#chart-reward .scatterlayer path.js-line").count() >= 1
        # The held-out evaluation beside the training reward, at the steps it ran.
        held_out = page.evaluate(
            f"{reward}.data.filter(t => t.name.startsWith('held-out')).map(t => [t.name, t.x])"
        )
        assert held_out == [
            ["held-out pass@1", [2, 4]],
            ["held-out pass@4", [2, 4]],
            ["held-out reward_mean", [2, 4]],
            ["held-out solved", [2, 4]],
            ["held-out used_tool", [2, 4]],
        ]

        # Live: a step posted now reaches the open page over the stream.
        feed(worker, run_id, range(5, 6), t0_us)
        wait_js(
            page,
            f"{reward}.data.some(t => t.name === 'reward/mean' && t.x.length === 5)",
            "the 5th reward point, live",
        )
        assert page.locator("#conn").inner_text() == "live (stream)"

        wait_js(
            page, "Number(document.getElementById('timeline').dataset.spans) > 0", "timeline spans"
        )
        assert page.locator("#timeline .barlayer path").count() >= 10
        lanes = page.evaluate(
            "[...new Set(document.getElementById('timeline').data.flatMap(t => t.y))]"
        )
        assert "trainer" in lanes and "episodes 1" in lanes, lanes

        trained = page.locator("#trajectories .traj .seg.trained")
        trained.first.wait_for(timeout=20_000)
        assert trained.all_inner_texts()[:2] == ["assistant: 5", "assistant: 8"]
        highlight = trained.first.evaluate("e => getComputedStyle(e).backgroundColor")
        plain = page.locator("#trajectories .traj .seg:not(.trained)").first
        assert highlight != plain.evaluate("e => getComputedStyle(e).backgroundColor")
        # Model and environment text is shown as text, never run as HTML.
        assert HOSTILE in plain.inner_text()
        assert page.locator("#trajectories img").count() == 0

        checkpoints = page.locator("#run-checkpoints").inner_text()
        assert "newest at step 4: file:///ckpt/step-4" in checkpoints

        inflight = page.locator("#inflight")
        assert "waiting_for_trajectories" in inflight.inner_text()
        assert page.locator("#inflight td.stuck").inner_text() == "42"

        page.wait_for_timeout(300)  # let plotly finish its transitions for the picture
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(shot, ARTIFACTS / "dashboard.png")

        feed(worker, run_id, range(6, 7), t0_us)
        worker.finish("succeeded")
        page.locator("#run-status.succeeded").wait_for(timeout=20_000)
        wait_js(
            page,
            "document.getElementById('conn').textContent === 'run ended'",
            "the feed ending with the run",
        )
        assert page.title() != "pwned"
    assert not errors, errors


def test_the_feed_resumes_after_a_cut_and_falls_back_to_polling(
    live: LiveApi, tmp_path: Path
) -> None:
    """Through a proxy: a cut stream resumes after the last step; a proxy that refuses
    the stream leaves the page polling, still live."""
    key = live.tenant()
    created = httpx.post(
        f"{live.url}/v1/runs",
        json={"spec": {"environment": {"name": "guess_number"}, "train": {"steps": 9}}},
        headers={"Authorization": f"Bearer {key}"},
    )
    run_id = created.json()["id"]
    worker = live.worker(run_id)
    worker.start()
    t0_us = int(time.time() * 1e6)
    feed(worker, run_id, range(1, 3), t0_us)
    reward = "document.getElementById('chart-reward').data"
    points = f"({reward} || []).find(t => t.name === 'reward/mean')?.x.length"

    with cutting_proxy(live.url) as proxy, chromium(tmp_path / "profile") as browser:
        page = browser.pages[0] if browser.pages else browser.new_page()
        page.goto(f"{proxy.url}/#key={key}&run={run_id}")
        wait_js(page, f"{points} === 2", "the first 2 steps")

        proxy.cut()
        feed(worker, run_id, range(3, 4), t0_us)
        wait_js(page, f"{points} === 3", "step 3 after the cut")
        streams = [r.decode("latin-1").lower() for r in proxy.requests if b"/stream" in r]
        assert any("last-event-id: 2" in r for r in streams[1:]), streams

        proxy.refuse.add(b"/metrics/stream")
        proxy.cut()
        wait_js(
            page,
            "document.getElementById('conn').textContent === 'live (polling)'",
            "the page falling back to polling",
        )
        feed(worker, run_id, range(4, 6), t0_us)
        wait_js(page, f"{points} === 5", "steps 4 and 5 by polling")
        # Each step once, in order, whichever way it came.
        assert page.evaluate(f"({reward}).find(t => t.name === 'reward/mean').x") == [1, 2, 3, 4, 5]


def test_the_pages_sse_parser_follows_the_spec(live: LiveApi, tmp_path: Path) -> None:
    """Chunks split anywhere, \\r\\n split across chunks, comments, multi-line data."""
    chunks = [
        "id: 1\r",
        '\nevent: metrics\r\ndata: {"a"',
        ":1}\r\n",
        "\r\n: keep-alive\n\n",
        "data: x\ndata: y\n\nid: 2\nevent: metrics\ndata: cut off",
    ]
    with chromium(tmp_path / "profile") as browser:
        page = browser.pages[0] if browser.pages else browser.new_page()
        page.goto(f"{live.url}/static/index.html#")
        events = page.evaluate(
            """async (chunks) => {
                const { SseParser } = await import('/static/sse.js');
                const seen = [];
                const parser = new SseParser((e) => seen.push(e));
                for (const c of chunks) parser.push(c);
                return seen;
            }""",
            chunks,
        )
    assert events == [
        {"event": "metrics", "data": '{"a":1}', "id": "1"},
        {"event": "message", "data": "x\ny", "id": None},
    ]

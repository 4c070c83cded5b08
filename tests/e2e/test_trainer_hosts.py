"""``resources: {hosts: 2, rollout_servers: 2}`` through the API, every part a real
process: the worker starts two trainer processes as Ray actors (a local Ray cluster) and
two vLLM CPU servers (`rl_core.rollout.fleet`). After step 2 one vLLM server is
SIGKILLed: the fleet takes it out, sends its requests to the other, restarts it onto the
newest weights, and it serves again. The run succeeds, with final weights equal (float32
tolerance, tests/rl_core/training/test_spmd.py) to the same spec's on one trainer process
and one server.

Why the two runs can agree: in sync mode every step's episodes are sampled by the weights
the trainer holds before it (each update checked on both servers by its probe), and vLLM
samples each request with the seed the collector gave it, which goes with a request sent
again to the other server. A sampled token differs only where float rounding decides
between two candidates: rare at this size (not seen here; measured 6e-6 apart at most).

While the killed server restarts (30-120 s) the test holds the other server (SIGSTOP
once the fleet has seen the first die, SIGCONT once it has it back), and with it the run,
whose requests or next update wait on it: the run would go on on the other server
meanwhile (tests/rl_core/pipeline/test_vllm_fleet.py shows it), but it would then need
tens of steps, in both runs, to outlast the restart. Holding the trainer processes instead
was flaky: jax.distributed's coordination service declared a process held 52 s dead.

One kill per run, to keep CI's time: a SIGKILLed trainer process too (the attempt ends as
a lost worker's and resumes from the last checkpoint on fresh processes and servers) passed
here with the same weights (6.0e-6) but cost another start of the fleet and the trainer,
463 s in all against 337-374 s (on 2 loaded cores); it is in this
file's history (commit 16607fb).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.stack import Stack, wait_until
from tests.rl_core.rollout.vllm_venv import ensure_vllm_venv

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(6)]

STEPS = 8  # after the kill: the step it is seen in, one it serves in, and slack
KILL_SERVER_AFTER = 2  # the step after which a vLLM server is killed
WEIGHT_TOL = 2e-5
# At most this long held (the fleet waits on a request up to 600 s, on an update 300 s).
HOLD_S = 240


def spec(hosts: int, servers: int) -> dict[str, Any]:
    return {
        # vLLM's CPU attention refuses builtin:tiny's head_dim (16): builtin:small (32).
        "model": {"source": "builtin:small"},
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 4, "max_turns": 2}},
        "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
        "rollout": {"engine": "vllm", "group_size": 4, "concurrency": 8},
        # A random policy earns no reward here (every advantage 0): the entropy bonus moves
        # the weights anyway, or the two runs' weights would agree because neither moved.
        "algorithm": {"batch_groups": 2, "learning_rate": 1e-3, "entropy_coef": 1.0},
        "staleness": {"mode": "sync"},
        "train": {"steps": STEPS, "seed": 0, "checkpoint_interval": 1},
        "resources": {"hosts": hosts, "rollout_servers": servers},
    }


def stack_processes(data_dir: str, marker: bytes) -> list[int]:
    """Processes whose command line holds ``marker`` and whose environment names this
    stack's data folder (the worker's children and Ray's actors inherit it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in title and f"={data_dir}\0".encode() in env:
            pids.append(int(entry.name))
    return pids


def trainer_processes(data_dir: str) -> list[int]:
    """The Ray actor processes of this stack's worker's trainer (a dying one included until
    it is gone)."""
    pids = []
    for pid in stack_processes(data_dir, b"ray::TrainerProcess"):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # it ended since the listing
            continue
        if title.startswith(b"ray::TrainerProcess"):
            pids.append(pid)
    return pids


def vllm_servers(data_dir: str) -> dict[int, int]:
    """{fleet index: pid} of the vLLM servers, each the head of its process group; the
    index is read from the log its output goes to (vllm-server-<i>.log)."""
    servers = {}
    for pid in stack_processes(data_dir, b"vllm.entrypoints.openai.api_server"):
        try:
            if os.getpgid(pid) != pid:
                continue
            found = re.search(r"vllm-server-(\d+)\.log$", os.readlink(f"/proc/{pid}/fd/1"))
        except OSError:
            continue
        if found:
            servers[int(found.group(1))] = pid
    return servers


def state(data_dir: str, run_id: str, step: int) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    folder = Path(data_dir) / "artifacts" / run_id / "checkpoints" / f"step-{step:08d}"
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
        restored = ckptr.restore(folder.absolute() / "state")
    return {name: np.asarray(value) for name, value in restored.items()}


@pytest.fixture
def fleet_stack(stack: Stack) -> Iterator[Stack]:
    """The stack, and after it no vLLM server of its runs: each runs in a session of its
    own, and a worker stopped mid-run (a failed test: its warm shutdown outlasts the stop's
    20 s and it is SIGKILLed) leaves them running."""
    yield stack
    stack.stop_all()
    for pid in vllm_servers(stack.env["RLAAS_DATA_DIR"]).values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.timeout(900)
def test_two_trainer_processes_and_two_vllm_servers_lose_a_server_and_match_one_process(
    fleet_stack: Stack,
) -> None:
    stack = fleet_stack
    stack.env.update(
        {
            "RLAAS_VLLM_PYTHON": str(ensure_vllm_venv()),
        }
    )
    data_dir = stack.env["RLAAS_DATA_DIR"]

    def log() -> str:
        return (stack.logs / "worker.log").read_text(errors="replace")

    stack.start_api()
    stack.start_worker()
    with stack.client() as client:

        def post(hosts: int, servers: int) -> str:
            r = client.post("/v1/runs", json={"spec": spec(hosts, servers)})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        def active(run_id: str) -> dict[str, Any]:
            now = dict(client.get(f"/v1/runs/{run_id}").json())
            assert now["status"] in ("queued", "starting", "running"), now
            return now

        def finished(run_id: str) -> dict[str, Any] | None:
            now = dict(client.get(f"/v1/runs/{run_id}").json())
            return now if now["status"] in ("succeeded", "failed", "cancelled") else None

        def points(run_id: str, name: str) -> dict[int, float]:
            r = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name})
            return {p["step"]: p["value"] for p in r.json()["points"]}

        two = post(2, 2)

        # A vLLM server is SIGKILLed after step 2, the run held meanwhile.
        def both_up() -> tuple[list[int], dict[int, int]] | None:
            now = active(two)
            trainers, servers = trainer_processes(data_dir), vllm_servers(data_dir)
            ready = len(trainers) == 2 and sorted(servers) == [0, 1]
            ready = ready and now["current_step"] >= KILL_SERVER_AFTER
            return (trainers, servers) if ready else None

        _, servers = wait_until(both_up, 300, f"step {KILL_SERVER_AFTER}", stack)
        os.killpg(servers[0], signal.SIGKILL)
        # Held only once the fleet has seen it down (its next request or update): held
        # before, nothing may reach the dead server, and its restart would not begin.
        wait_until(lambda: "rollout server 0 of 2 is down" in log(), 120, "its death seen", stack)
        held = time.monotonic()
        os.killpg(servers[1], signal.SIGSTOP)
        try:
            while "rollout server 0 is back" not in log() and time.monotonic() - held < HOLD_S:
                time.sleep(0.5)
        finally:
            os.killpg(servers[1], signal.SIGCONT)
        held_s = time.monotonic() - held
        assert "rollout server 0 is back" in log(), f"held {held_s:.0f} s\n{stack.dump_logs()}"

        final = wait_until(lambda: finished(two), 300, "the run to finish", stack)
        assert final["status"] == "succeeded", f"{final}\n{stack.dump_logs()}"
        assert final["attempts"] == 1, final
        # It served again: a step whose episodes it sampled, once it was back (both up and
        # one recovery at the update before that step).
        up, recoveries = points(two, "fleet/servers_up"), points(two, "fleet/recoveries")
        requests = points(two, "fleet/server_0/requests")
        assert any(
            n > 0 and up.get(s - 1) == 2 and recoveries.get(s - 1) == 1 for s, n in requests.items()
        ), (up, recoveries, requests)
        # Every step sampled with the weights the trainer held, the restarted server too.
        mismatch = points(two, "mismatch_kl")
        assert sorted(mismatch) == list(range(1, STEPS + 1)), mismatch
        assert max(mismatch.values()) < 1e-3, mismatch
        # The trainer processes and servers are gone.
        wait_until(
            lambda: not trainer_processes(data_dir) and not vllm_servers(data_dir),
            30,
            "the trainer processes and servers to stop",
            stack,
        )

        # The reference: one trainer process and one server (a server samples each
        # request with its own seed, whichever server and batch it lands in).
        one = post(1, 1)
        final_one = wait_until(lambda: finished(one), 300, "the one-process run", stack)
        assert final_one["status"] == "succeeded", f"{final_one}\n{stack.dump_logs()}"
        for name in ("loss", "reward/mean"):
            got, want = (points(i, name) for i in (two, one))
            assert got[STEPS] == pytest.approx(want[STEPS], rel=1e-4), name
        resent = points(two, "fleet/resent")

    want_state, got_state = state(data_dir, one, STEPS), state(data_dir, two, STEPS)
    assert want_state.keys() == got_state.keys()
    worst = max(float(np.max(np.abs(got_state[k] - v))) for k, v in want_state.items())
    # The last 3 checkpoints are kept: how far the last two steps alone moved a weight
    # (the state's other entries are counters and the optimiser's moments).
    before = state(data_dir, one, STEPS - 2)
    moved = max(
        float(np.max(np.abs(before[k] - v)))
        for k, v in want_state.items()
        if k.startswith("trainable.")
    )
    print(
        f"server held out {held_s:.0f} s, {max(resent.values(), default=0):.0f} requests "
        f"sent again; max |w(hosts 2) - w(hosts 1)| = {worst:.1e}; the last 2 steps moved "
        f"a weight by {moved:.1e}"
    )
    assert moved > 50 * WEIGHT_TOL  # the comparison below means something
    for name, value in want_state.items():
        np.testing.assert_allclose(got_state[name], value, atol=WEIGHT_TOL, rtol=0, err_msg=name)

"""A worker SIGKILLed with a vLLM server running takes the server with it.

`VllmServer` starts the server in a session of its own (so `stop` can signal its
processes together), which no signal to the worker reaches: before the lifeline
(rl_core/host/lifeline.py) a killed worker left its servers running. The server here is
a stand-in for vLLM's (an interpreter that answers the two routes `start` waits for), so
the test costs seconds: what it checks is `VllmServer`'s wiring, which is the same for
the real one (tests/rl_core/rollout/test_vllm_engine.py starts that)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.rl_core.host.test_lifeline import alive, wait_gone

# Run as `<this> -m vllm.entrypoints.openai.api_server ... --port N ...`.
STAND_IN = textwrap.dedent(
    """
    import http.server, os, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"choices": [{"token_ids": [0]}]}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = answer
        def log_message(self, *args):
            pass
    print("stand-in", os.getpid(), flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)

OWNER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from rl_core.rollout.vllm_server import VllmServer, VllmServerConfig
    python, model, log = map(Path, sys.argv[1:4])
    server = VllmServer(model, VllmServerConfig(max_model_len=64, python=python), log_path=log)
    server.start()
    print(json.dumps({"group": server.pid}), flush=True)
    time.sleep(600)
    """
)


def test_a_killed_owners_server_ends_with_it(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{STAND_IN}")
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    log = tmp_path / "server.log"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(python), str(model), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    group = json.loads(owner.stdout.readline())["group"]
    try:
        server = int(log.read_text().split()[1])  # the stand-in, in the lifeline's session
        assert alive(group) and alive(server)
        time.sleep(1.0)
        assert alive(server)  # the owner lives: the server runs on
        owner.kill()
        owner.wait()
        assert wait_gone(server, timeout_s=15.0) < 5.0
        wait_gone(group, timeout_s=5.0)
    finally:  # failed: nothing left running
        owner.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)

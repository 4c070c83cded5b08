"""A webhook environment server as a tenant writes it from docs/environment-protocol.md
alone, on the standard library: `http.server.ThreadingHTTPServer` with its defaults.

Its listen backlog is socketserver's default, ``request_queue_size = 5``, and it speaks
HTTP/1.0 (a new connection per request). Under a burst of connections the kernel's
accept queue overflows: connections are dropped, reset or left hanging in the
handshake. That is the server the worker must adapt to (issue #18 item 5).

Run as its own process (``python -m tests.faults.naive_server SECRET``): it prints
its port on the first line of stdout, then serves until stdin closes. The game: reset
asks for a number from 1 to 3; the one step pays 1.0 for ``str(seed % 3 + 1)`` in the
answer. Counters (requests by route, steps applied) are printed to stderr at exit.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections import Counter
from typing import Any

from rl_core.protocol.signing import HEADER, SignatureError, verify

WORK_S = 0.002  # what a real handler spends per request (a lookup, a little compute)


class NaiveEnv:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.lock = threading.Lock()
        self.seeds: dict[str, int] = {}
        self.answers: dict[tuple[str, int], dict[str, Any]] = {}
        self.requests: Counter[str] = Counter()
        self.applied = 0

    def handle(self, route: str, raw: bytes, signature: str | None) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests[route] += 1
        try:
            verify(self.secret, raw, signature)
        except SignatureError as exc:
            return 401, {"error": {"code": "bad_signature", "message": str(exc)}}
        body = json.loads(raw)
        episode = body["episode_id"]
        if route == "/reset":
            with self.lock:
                self.seeds[episode] = int(body["seed"])
            prompt = "Guess a number from 1 to 3. Answer with the number only."
            return 200, {"messages": [{"role": "user", "content": prompt}]}
        if route == "/step":
            key = (episode, int(body["step"]))
            with self.lock:  # idempotent: a retried step gets the first answer
                if key not in self.answers:
                    target = str(self.seeds.get(episode, 0) % 3 + 1)
                    said = str(body["action"]["content"])
                    reward = 1.0 if target in said else 0.0
                    self.answers[key] = {"messages": [], "reward": reward, "done": True}
                    self.applied += 1
                return 200, self.answers[key]
        if route == "/close":
            with self.lock:
                self.seeds.pop(episode, None)
            return 200, {"closed": True}
        return 404, {"error": {"code": "not_found", "message": route}}


def make_server(secret: str) -> tuple[http.server.ThreadingHTTPServer, NaiveEnv]:
    env = NaiveEnv(secret)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            threading.Event().wait(WORK_S)
            status, answer = env.handle(self.path, raw, self.headers.get(HEADER))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    # The defaults a tenant gets: request_queue_size 5, HTTP/1.0.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    return server, env


def main() -> None:
    server, env = make_server(sys.argv[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.shutdown()
    print(json.dumps({"requests": dict(env.requests), "applied": env.applied}), file=sys.stderr)


if __name__ == "__main__":
    main()

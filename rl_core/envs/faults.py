"""What went wrong with one request to an environment server, in words and by kind.

How an answer is classified (retried or not; a sign of overload or not), the reasons
failed requests are counted under (``env/faults/<reason>``), and how an answer that
went wrong is described to the tenant without copying what it said.
"""

from __future__ import annotations

import contextlib
import json

from rl_core.envs.transport import Answer

# Answers worth another attempt besides the 5xx.
RETRYABLE_STATUS = frozenset({408, 425, 429})
# A server's ways of saying "too much at once" (besides timeouts and refused or reset
# connections): they lower the concurrency limit instead of counting as failures.
OVERLOAD_STATUS = frozenset({429, 503})
OVERLOAD_KINDS = frozenset({"timeout", "connect", "reset"})
# Overloads one call may retry without counting them: halving any registered limit
# (at most 10,000) down to 1 takes 14 cuts. Past that the server is not recovering.
ABSORBED_MAX = 16
# Why a request failed, as counted in ``env/faults/<reason>``:
FAULT_REASONS = (
    "timeout",  # no whole answer within timeout_s (a hang, a slow drip, a stalled connect)
    "connect",  # no connection: refused, unreachable
    "reset",  # the connection was reset or closed before the answer
    "broken",  # an answer cut short or not HTTP
    "status_overload",  # 429, 503
    "status_error",  # 408, 425 and the other 5xx
    "status_refused",  # the other 4xx (not retried)
    "redirect",  # 3xx (not followed, not retried)
    "protocol",  # a 2xx whose body is not JSON or not the protocol's shape
    "too_large",  # an answer over transport.MAX_ANSWER_BYTES
    "circuit_open",  # no request: the breaker holds calls off
    "address_refused",  # no request: the allowlist refuses the address
    "deferred_timeout",  # a deferred result that never came
)

_EXCERPT = 200


def reason(response: Answer) -> str:
    """The server's own words when it answered with the protocol's error body (cut short,
    control characters dropped); otherwise only what kind of answer it was.

    Never the raw body: the error reaches the tenant, and a URL that now points somewhere
    else (a cloud metadata address, another internal service) must not be read back.
    """
    with contextlib.suppress(ValueError):
        body = json.loads(response.body)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "message" in error:
            message = "".join(c for c in str(error["message"]) if c.isprintable())
            return message[:_EXCERPT] + ("…" if len(message) > _EXCERPT else "")
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return (
        f"{response.reason or 'no reason'} ({kind}, {len(response.body)} bytes, "
        "not the protocol's error body)"
    )


def rejection(response: Answer, url: str) -> str:
    hint = ""
    if response.status == 401:
        hint = "; check that the secret registered with rlaas is the one the server verifies with"
    return f"POST {url} was rejected with {response.status}: {reason(response)}{hint}"


def retry_after(response: Answer) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


__all__ = [
    "ABSORBED_MAX",
    "FAULT_REASONS",
    "OVERLOAD_KINDS",
    "OVERLOAD_STATUS",
    "RETRYABLE_STATUS",
    "reason",
    "rejection",
    "retry_after",
]

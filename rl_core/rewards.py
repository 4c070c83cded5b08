"""Reward functions attached to a run by name (``environment.reward`` in the spec).

``environment.reward: "numeric_match+length_penalty:0.002"`` replaces the
environment's own reward: when the environment ends an episode, the terms are
computed from the whole episode and summed, each times its weight (the number
after ``:``, else the function's default weight). Before the end every step's
reward is 0, so the return of the episode is exactly the sum of the terms.

A function sees a `RewardContext`. The reference answer is what the
environment put under ``"answer"`` in its reset ``info`` (the built-ins and
any webhook environment can do so); a function that needs it fails the
episode with a message saying so when it is missing.

An episode that the agent cuts short (turn or token limits) gets no terms:
the environment never judged it, so there is nothing to compare.

Verifiers (``math``, ``exact``, ``regex``, ``numeric``, ``json_schema``,
``python_tests``, ``webhook``, ``judge``) are reward functions that check the answer against the
reference. They are registered here, so that the spec (and the control plane)
knows their names without their libraries, which are imported only when one
runs (``math-verify`` and ``jsonschema-rs`` are the worker's). A verifier that
raises or passes its time limit raises `VerifierFailed` from `score_async`: the
episode fails, counted by reason, and is never scored 0 for the checker's fault.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class RewardContext:
    contents: tuple[str, ...]  # the assistant's message text, one per step
    reference: Any  # reset info["answer"], or None
    env_reward: float  # what the environment itself gave, summed over the episode
    turns: int
    info: dict[str, Any]  # reset and step infos, merged
    # Runs a Python program in the sandbox (``python_tests``); the environment's wrapper
    # (`rl_core.envs.scored.Scored`) supplies it, since this module may not import it.
    sandbox: Callable[[str], Awaitable[ProgramRun]] | None = None
    # Scores the episode at the run's registered scorer endpoint (``webhook``); supplied
    # by `Scored` when the spec names one (``environment.scorer``).
    scorer: Callable[[RewardContext], Awaitable[float]] | None = None
    episode_id: str = ""
    prompt: tuple[dict[str, Any], ...] = ()  # the reset's messages (system, user)

    @property
    def final(self) -> str:
        return self.contents[-1] if self.contents else ""


@dataclasses.dataclass(frozen=True)
class ProgramRun:
    """How a sandboxed program ended (the part of a sandbox result a verifier reads)."""

    exit_code: int | None
    stdout: str
    stderr: str
    killed_by: str | None  # wall_time | cpu_time | output | None


class MissingReference(ValueError):
    """The reward needs a reference answer the environment did not give."""


class VerifierFailed(Exception):
    """A reward function raised or ran out of time: the episode fails, it is not scored."""

    def __init__(self, name: str, reason: str, detail: str) -> None:
        super().__init__(f"reward {name!r} {reason}: {detail}")
        self.name = name
        self.reason = reason  # error | timeout, or a `CheckFailed`'s own
        self.detail = detail


class CheckFailed(Exception):
    """A check that knows why it failed: `score_async` counts it under ``reason`` (a
    scorer endpoint that is unavailable, refused the request, or answered badly)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


RewardFn = Callable[[RewardContext], float] | Callable[[RewardContext], Awaitable[float]]


@dataclasses.dataclass(frozen=True)
class RewardFunction:
    fn: RewardFn
    default_weight: float
    doc: str
    # Slow checks (a symbolic comparison) run in a thread, under `score_async`'s limit.
    slow: bool = False
    # Scored over a whole group once its members end (``judge``), not per episode:
    # `score` and `score_async` leave it out; `rl_core.envs.scored.Scored` adds it later.
    group: bool = False


REWARDS: dict[str, RewardFunction] = {}


def register_reward(
    name: str,
    fn: RewardFn,
    *,
    default_weight: float = 1.0,
    doc: str = "",
    slow: bool = False,
    group: bool = False,
) -> None:
    """Make ``fn`` attachable by ``name``; names are lower-case identifiers. ``fn`` may be
    a coroutine function (it is awaited by `score_async`)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"reward name {name!r} must be a lower-case identifier")
    REWARDS[name] = RewardFunction(
        fn=fn, default_weight=default_weight, doc=doc, slow=slow, group=group
    )


def group_terms(terms: tuple[RewardTerm, ...]) -> tuple[RewardTerm, ...]:
    """The terms scored over a whole group (``judge``), which `score_async` leaves out."""
    return tuple(t for t in terms if REWARDS[t.name].group)


@dataclasses.dataclass(frozen=True)
class RewardTerm:
    name: str
    weight: float


def parse_reward(text: str) -> tuple[RewardTerm, ...]:
    """``"a+b:0.5"`` -> terms; ValueError naming the part that is wrong."""
    terms = []
    for part in text.split("+"):
        name, sep, weight_text = part.strip().partition(":")
        if name not in REWARDS:
            raise ValueError(
                f"unknown reward function {name!r}; known: {', '.join(sorted(REWARDS))}"
            )
        weight = REWARDS[name].default_weight
        if sep:
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(f"reward {part.strip()!r}: weight must be a number") from None
            if not math.isfinite(weight):
                raise ValueError(f"reward {part.strip()!r}: weight must be finite")
        terms.append(RewardTerm(name=name, weight=weight))
    return tuple(terms)


def score(terms: tuple[RewardTerm, ...], ctx: RewardContext) -> dict[str, float]:
    """Each term's weighted value, by name (a name used twice is summed); synchronous
    functions only (`score_async` runs them all)."""
    values: dict[str, float] = {}
    for term in terms:
        if REWARDS[term.name].group:
            continue
        value = REWARDS[term.name].fn(ctx)
        if inspect.isawaitable(value):
            value.close()  # type: ignore[attr-defined]
            raise TypeError(f"reward {term.name!r} is asynchronous: use score_async")
        values[term.name] = values.get(term.name, 0.0) + term.weight * float(value)
    return values


async def score_async(
    terms: tuple[RewardTerm, ...], ctx: RewardContext, *, timeout_s: float = 10.0
) -> dict[str, float]:
    """`score` for any reward function, each under ``timeout_s``; `VerifierFailed` (with
    the reason, ``error`` or ``timeout``, or a `CheckFailed`'s own) when one raises or runs
    out of time.
    `MissingReference` passes through: the environment's fault, not the checker's.

    A slow synchronous check runs in a thread; a thread cannot be stopped, so one past its
    limit finishes in the background while the episode is already failed."""
    values: dict[str, float] = {}
    for term in terms:
        reward = REWARDS[term.name]
        if reward.group:
            continue
        try:
            async with asyncio.timeout(timeout_s):
                if inspect.iscoroutinefunction(reward.fn):
                    value = await reward.fn(ctx)
                elif reward.slow:
                    value = await asyncio.to_thread(reward.fn, ctx)
                else:
                    value = reward.fn(ctx)
            number = float(value)
        except MissingReference:
            raise
        except CheckFailed as exc:
            raise VerifierFailed(term.name, exc.reason, str(exc)) from exc
        except TimeoutError as exc:  # the limit here, or a check's own (`verify_regex`)
            detail = str(exc) or f"no answer in {timeout_s:g} s"
            raise VerifierFailed(term.name, "timeout", detail) from None
        except Exception as exc:
            raise VerifierFailed(term.name, "error", f"{type(exc).__name__}: {exc}") from exc
        if not math.isfinite(number):
            raise VerifierFailed(term.name, "error", f"gave {number}, not a finite number")
        values[term.name] = values.get(term.name, 0.0) + term.weight * number
    return values


def normalize(text: str) -> str:
    """Case, surrounding space and punctuation, and inner runs of space do not matter."""
    return " ".join(str(text).casefold().split()).strip(" .!\"'`")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def _reference(ctx: RewardContext, name: str) -> Any:
    if ctx.reference is None:
        raise MissingReference(
            f"reward {name!r} compares with a reference answer, but the environment's reset "
            "info has no 'answer'; put one there or attach a reward that needs none"
        )
    return ctx.reference


def exact_match(ctx: RewardContext) -> float:
    return float(normalize(ctx.final) == normalize(_reference(ctx, "exact_match")))


def numeric_match(ctx: RewardContext) -> float:
    want = float(_reference(ctx, "numeric_match"))
    got = last_number(ctx.final)
    return float(got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6))


def contains(ctx: RewardContext) -> float:
    return float(normalize(_reference(ctx, "contains")) in normalize(ctx.final))


register_reward("env", lambda ctx: ctx.env_reward, doc="the environment's own reward")
register_reward("exact_match", exact_match, doc="1 if the final message equals the answer")
register_reward("numeric_match", numeric_match, doc="1 if its last number equals the answer")
register_reward("contains", contains, doc="1 if the final message contains the answer")
register_reward(
    "length_penalty",
    lambda ctx: -float(sum(len(c) for c in ctx.contents)),
    default_weight=0.001,
    doc="minus the characters the assistant wrote (default 0.001 per character)",
)
register_reward(
    "turn_penalty",
    lambda ctx: -float(max(0, ctx.turns - 1)),
    default_weight=0.1,
    doc="minus the turns after the first (default 0.1 per turn)",
)


# --- verifiers: the answer checked against a dataset row's reference ---------------------

# The end of an answer is where the result is; a checker reads no more than this of it,
# so a model that writes pages cannot make the check slow.
_TAIL_CHARS = 4000
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def final_answer(text: str) -> str:
    """What a verifier compares: the last boxed answer if any, else the whole message."""
    found = boxed(text)
    return found if found is not None else text


def _tail(ctx: RewardContext) -> str:
    return ctx.final[-_TAIL_CHARS:]


def verify_math(ctx: RewardContext) -> float:
    """``math-verify`` (boxed LaTeX or a plain expression; the last number as a fallback)
    against the reference; 1 if they are equal as mathematics (``1/2`` = ``0.5``)."""
    from math_verify import parse, verify  # the worker's extra

    reference = str(_reference(ctx, "math"))
    answer = _tail(ctx)
    # No timeouts of math-verify's own: they use SIGALRM, which works only in the main
    # thread; `score_async` bounds the whole check instead.
    gold = parse(f"${reference}$" if "$" not in reference else reference, parsing_timeout=None)
    if not gold:
        gold = parse(reference, parsing_timeout=None)
    if not gold:
        raise ValueError(f"math-verify cannot read the reference {reference[:200]!r}")
    target = parse(answer, parsing_timeout=None)
    if target and verify(gold, target, timeout_seconds=None, raise_on_error=True):
        return 1.0
    number = last_number(final_answer(answer))
    want = last_number(reference)
    if number is None or want is None or target:
        return 0.0
    return float(math.isclose(number, want, rel_tol=1e-9, abs_tol=1e-9))


def verify_exact(ctx: RewardContext) -> float:
    """1 if the final (boxed) answer equals the reference, case, spaces and surrounding
    punctuation aside."""
    return float(normalize(final_answer(_tail(ctx))) == normalize(_reference(ctx, "exact")))


# A tenant's pattern may backtrack for ever ("(a+)+$" on a long answer). The `regex`
# package stops its own match at a deadline and lets go of the GIL while matching, so the
# check runs in a thread (``slow``) and that thread ends itself, under `score_async`'s
# default limit, instead of running on after the episode has failed.
REGEX_TIMEOUT_S = 5.0


def verify_regex(ctx: RewardContext) -> float:
    """1 if the reference, a regular expression, matches the whole final (boxed) answer."""
    import regex

    pattern = regex.compile(str(_reference(ctx, "regex")))
    answer = final_answer(_tail(ctx)).strip()
    try:
        found = pattern.fullmatch(answer, timeout=REGEX_TIMEOUT_S, concurrent=True)
    except TimeoutError:
        raise TimeoutError(f"the pattern ran past {REGEX_TIMEOUT_S:g} s on the answer") from None
    return float(found is not None)


def verify_numeric(ctx: RewardContext) -> float:
    """1 if the last number of the final (boxed) answer is within the tolerance of the
    reference: ``info["tolerance"]`` (relative and absolute), else 1e-6."""
    want = float(_reference(ctx, "numeric"))
    tolerance = float(ctx.info.get("tolerance", 1e-6))
    got = last_number(final_answer(_tail(ctx)))
    return float(got is not None and math.isclose(got, want, rel_tol=tolerance, abs_tol=tolerance))


def _json_of(text: str) -> Any:
    import json

    blocks = _FENCE.findall(text)
    candidate = blocks[-1] if blocks else text.strip()
    return json.loads(candidate)


def verify_json_schema(ctx: RewardContext) -> float:
    """1 if the answer (a ```json block, else the whole message) is JSON valid under the
    reference, a JSON Schema (an object, or its JSON text); 0 if it does not parse."""
    import json

    import jsonschema_rs  # the worker's extra

    schema = _reference(ctx, "json_schema")
    if isinstance(schema, str):
        schema = json.loads(schema)
    validator = jsonschema_rs.validator_for(schema)  # a bad schema raises: a failed check
    try:
        answer = _json_of(ctx.final)
    except ValueError:
        return 0.0
    return float(validator.is_valid(answer))


async def verify_python_tests(ctx: RewardContext) -> float:
    """1 if the answer's code (its last ```python block, else the whole message) followed
    by the reference (the row's tests: asserts) runs to exit status 0 in the sandbox."""
    tests = str(_reference(ctx, "python_tests"))
    if ctx.sandbox is None:
        raise RuntimeError("python_tests needs the sandbox; the environment gave none")
    blocks = _FENCE.findall(ctx.final)
    code = blocks[-1] if blocks else ctx.final
    run = await ctx.sandbox(f"{code}\n\n{tests}\n")
    return float(run.exit_code == 0 and run.killed_by is None)


async def verify_webhook(ctx: RewardContext) -> float:
    """The score the run's registered scorer endpoint gives the episode (POST /score,
    signed like environments; docs/environment-protocol.md#scoring), as it is."""
    if ctx.scorer is None:
        raise RuntimeError(
            "webhook scores at a registered endpoint; name it in environment.scorer (env_...)"
        )
    return await ctx.scorer(ctx)


register_reward("math", verify_math, slow=True, doc="math-verify: the answer equals the reference")
register_reward("exact", verify_exact, doc="the final (boxed) answer equals the reference")
register_reward(
    "regex", verify_regex, doc="the reference pattern matches the final answer", slow=True
)
register_reward("numeric", verify_numeric, doc="the last number is within tolerance")
register_reward(
    "json_schema", verify_json_schema, doc="the answer is JSON valid under the reference schema"
)
register_reward(
    "python_tests", verify_python_tests, doc="the answer's code passes the reference tests"
)
register_reward(
    "webhook", verify_webhook, doc="the score of the registered endpoint environment.scorer"
)


def _judged_by_group(ctx: RewardContext) -> float:
    raise RuntimeError("'judge' scores a whole group: it is never called for one episode")


register_reward(
    "judge",
    _judged_by_group,
    group=True,
    doc="an LLM judge's score against environment.judge's rubric, one call per group",
)

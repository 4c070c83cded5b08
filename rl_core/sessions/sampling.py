"""A client's sampling fields within the run's bounds: the sampler one call is drawn with.

A framework sends ``temperature``, ``top_p``, the OpenAI penalties (and vLLM's
``top_k``) as its user set them: LangGraph users write ``temperature=0``, openai-agents
passes its ``ModelSettings``. The run decides, in its spec, whether they are honoured
(``rollout.client_sampling``):

- ``mode: allow`` (the default): each call is sampled as asked, within the bounds
  (``min_temperature`` to ``max_temperature``, ``top_p`` at least ``min_top_p``,
  penalties at most ``max_penalty`` either way); a field left out is the run's
  (``rollout.sampling``; penalties 0). The call's logprobs are recorded as sampled,
  under the distribution each token was drawn from, so the trainer's importance
  weight (current policy over behaviour policy, clipped) corrects for the difference
  from the run's sampler, as it does for a stale policy. ``temperature: 0`` (and
  ``top_p: 0``, whose nucleus is the one most likely token) is greedy: the logprobs
  are 0, a point mass.
- ``mode: pin``: a call is sampled with the run's sampler; a field that asks for
  anything else is refused, naming ``rollout.client_sampling.mode``.

A value outside the bounds is refused (never clamped: the client would believe it
sampled at a temperature it did not), every such field named in the one error.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from rl_core.protocol.chat_completions import Problem
from rl_core.rollout.base import SamplingParams

SPEC = "rollout.client_sampling"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientSampling:
    """What of the sampler a client may choose (the spec's ``rollout.client_sampling``)."""

    mode: Literal["allow", "pin"] = "allow"
    min_temperature: float = 0.0
    max_temperature: float = 2.0
    min_top_p: float = 0.0
    max_penalty: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_temperature <= self.max_temperature:
            raise ValueError("min_temperature must be at least 0 and at most max_temperature")
        if not 0 <= self.min_top_p <= 1 or self.max_penalty < 0:
            raise ValueError("min_top_p must be in [0, 1] and max_penalty at least 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asked:
    """A request's sampling fields; None where it left one out."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


def call_sampler(
    run: SamplingParams, bounds: ClientSampling, asked: Asked
) -> tuple[SamplingParams, list[Problem]]:
    """The sampler of one call, and what of ``asked`` is refused (nothing: ``[]``)."""
    wanted = SamplingParams(
        temperature=run.temperature if asked.temperature is None else asked.temperature,
        top_p=run.top_p if asked.top_p is None else asked.top_p,
        top_k=run.top_k if asked.top_k is None else max(asked.top_k, 0),  # vLLM's -1: off
        frequency_penalty=asked.frequency_penalty or 0.0,
        presence_penalty=asked.presence_penalty or 0.0,
    )
    problems = _pinned(run, wanted) if bounds.mode == "pin" else _outside(bounds, wanted)
    if wanted.top_p == 0:  # the nucleus of no mass: the most likely token, greedy
        wanted = dataclasses.replace(wanted, temperature=0.0, top_p=1.0)
    return wanted, problems


def is_run_sampler(run: SamplingParams, used: SamplingParams) -> bool:
    return not _differ(run, used)


def _differ(run: SamplingParams, wanted: SamplingParams) -> list[str]:
    fields = ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty")
    return [
        f for f in fields if not math.isclose(getattr(run, f), getattr(wanted, f), abs_tol=1e-6)
    ]


def _pinned(run: SamplingParams, wanted: SamplingParams) -> list[Problem]:
    return [
        Problem(
            field,
            f"Unsupported value for '{field}': this run pins the sampler "
            f"({SPEC}.mode: pin) and samples with {field} {getattr(run, field)}, not "
            f"{getattr(wanted, field)}. Omit {field}, or send {getattr(run, field)}.",
            "unsupported_value",
        )
        for field in _differ(run, wanted)
    ]


def _outside(bounds: ClientSampling, wanted: SamplingParams) -> list[Problem]:
    problems = []

    def refuse(field: str, value: float, allowed: str, spec_fields: str) -> None:
        problems.append(
            Problem(
                field,
                f"Unsupported value for '{field}': {value} is outside this run's bounds "
                f"({allowed}, {spec_fields}).",
                "unsupported_value",
            )
        )

    t = wanted.temperature
    if not bounds.min_temperature <= t <= bounds.max_temperature:
        refuse(
            "temperature",
            t,
            f"{bounds.min_temperature} to {bounds.max_temperature}",
            f"{SPEC}.min_temperature and max_temperature",
        )
    if wanted.top_p < bounds.min_top_p:
        refuse("top_p", wanted.top_p, f"at least {bounds.min_top_p}", f"{SPEC}.min_top_p")
    for field in ("frequency_penalty", "presence_penalty"):
        value = getattr(wanted, field)
        if abs(value) > bounds.max_penalty:
            most = bounds.max_penalty
            refuse(field, value, f"-{most} to {most}", f"{SPEC}.max_penalty")
    return problems


__all__ = ["SPEC", "Asked", "ClientSampling", "call_sampler", "is_run_sampler"]

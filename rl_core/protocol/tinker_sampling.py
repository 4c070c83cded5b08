"""What a Tinker ``asample`` may ask besides tokens, checked the same way by the control
plane (before any work) and by the model worker (no JAX here).

Served: ``prompt_logprobs`` (each prompt token's logprob, None at position 0),
``prompt_logprobs_last_n`` (only the last N), ``topk_prompt_logprobs`` (the k likeliest
tokens at each prompt position) and ``topk_sample_logprobs`` (at each sampled token).
Refused, naming the field: ``target_prompt_logprobs`` and ``prompt_alt_tokens_k``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_core.errors import UnsupportedSpec

MAX_TOPK_PROMPT = 64  # top-k rows at each prompt position (rl_core.training.scoring)
MAX_TOPK_SAMPLE = 20  # the engine's rl_core.rollout.sampling.TOP_LOGPROBS


@dataclasses.dataclass(frozen=True)
class PromptScoring:
    """What to score of the prompt and the samples; all off by default."""

    prompt_logprobs: bool = False
    last_n: int | None = None
    topk_prompt: int = 0
    topk_sample: int = 0

    @property
    def scores_prompt(self) -> bool:
        return self.prompt_logprobs or self.topk_prompt > 0


def _count(body: dict[str, Any], name: str, most: int) -> int:
    value = body.get(name) or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise UnsupportedSpec(name, f"must be an integer from 0 to {most}, got {value!r}")
    return value


def read_scoring(body: dict[str, Any], prompt_len: int) -> PromptScoring:
    """The scoring an asample body asks for (the SDK's ``SampleRequest`` fields)."""
    include = body.get("prompt_logprobs") or False
    if not isinstance(include, bool):
        raise UnsupportedSpec("prompt_logprobs", f"must be true or false, got {include!r}")
    topk_prompt = _count(body, "topk_prompt_logprobs", MAX_TOPK_PROMPT)
    topk_sample = _count(body, "topk_sample_logprobs", MAX_TOPK_SAMPLE)
    last_n = body.get("prompt_logprobs_last_n")
    if last_n is not None:
        if not include:
            raise UnsupportedSpec(
                "prompt_logprobs_last_n", "applies to prompt logprobs; set prompt_logprobs"
            )
        if isinstance(last_n, bool) or not isinstance(last_n, int) or not 1 <= last_n < prompt_len:
            raise UnsupportedSpec(
                "prompt_logprobs_last_n",
                f"must be from 1 to len(prompt) - 1 ({prompt_len - 1}), got {last_n!r}",
            )
    if body.get("target_prompt_logprobs") is not None:
        raise UnsupportedSpec(
            "target_prompt_logprobs",
            "is not served yet; ask for topk_prompt_logprobs, or prompt_logprobs of a prompt "
            "that ends in the token to score",
        )
    if body.get("prompt_alt_tokens_k"):
        raise UnsupportedSpec("prompt_alt_tokens_k", "is not served yet; send 0")
    return PromptScoring(include, last_n, topk_prompt, topk_sample)


__all__ = ["MAX_TOPK_PROMPT", "MAX_TOPK_SAMPLE", "PromptScoring", "read_scoring"]

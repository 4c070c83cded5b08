"""The Tinker cookbook's own RL loop (``tinker_cookbook.rl.train.main``, 0.6.1), unchanged,
pointed at rlaas by ``base_url``: a stranger's program, run by
tests/app/test_tinker_cookbook.py as a subprocess (so the cookbook's logging setup stays
out of the test process).

    python -m tests.app.cookbook_rl_loop BASE_URL LOG_PATH LOSS_FN [LOSS_FN_CONFIG_JSON]

with ``TINKER_API_KEY=tml-<rlaas key>``. The model is ``builtin:tiny``; the task is a
token-level environment written here: the reward is the share of the completion's tokens
that are lowercase letters. The cookbook computes the KL penalty against the base model
and the post-update KL with prompt logprobs (``score_sequences``), and the sample/train
mismatch from forward_backward's logprobs.

The one seam a model off the Hugging Face hub needs: the cookbook asks
``tinker_cookbook.tokenizer_utils.get_tokenizer(model_name)``, which falls back to the
hub. ``register_tokenizer(model_name, factory)`` answers it instead (here rlaas's own
built-in tokenizer; for an exported SmolLM2 folder,
``lambda: AutoTokenizer.from_pretrained(folder)``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import string
import sys
from collections.abc import Sequence
from typing import Any

import chz
import tinker
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
)
from tinker_cookbook.tokenizer_utils import register_tokenizer

from rl_core.models.tokenizer import BuiltinTokenizer

MODEL = "builtin:tiny"
PROMPT = "Answer with a"
STEPS, GROUPS, GROUP_SIZE, MAX_TOKENS = 2, 2, 4, 6


class _Tokenizer:
    """What the cookbook reads of a tokenizer (decode for its logs, eos_token_id)."""

    def __init__(self) -> None:
        self._inner = BuiltinTokenizer()
        self.eos_token_id = self._inner.eos_id

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return self._inner.encode(text)

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return self._inner.decode(list(ids))


TOKENIZER = _Tokenizer()
TARGETS = frozenset(TOKENIZER.encode(string.ascii_lowercase))


class TargetTokenEnv(Env):
    """One turn: the prompt, then reward = share of the completion's tokens in TARGETS."""

    async def initial_observation(self) -> tuple[Observation, list[int]]:
        return tinker.ModelInput.from_ints(TOKENIZER.encode(PROMPT)), [TOKENIZER.eos_token_id]

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        share = sum(t in TARGETS for t in action) / max(len(action), 1)
        return StepResult(
            reward=share,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[TOKENIZER.eos_token_id],
            metrics={"target_share": share},
        )


@dataclasses.dataclass(frozen=True)
class TargetGroup(EnvGroupBuilder):
    size: int

    async def make_envs(self) -> Sequence[Env]:
        return [TargetTokenEnv() for _ in range(self.size)]

    def logging_tags(self) -> list[str]:
        return ["target"]


class TargetDataset(RLDataset):
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [TargetGroup(GROUP_SIZE) for _ in range(GROUPS)]

    def __len__(self) -> int:
        return STEPS


@chz.chz
class TargetDatasetBuilder(RLDatasetBuilder):
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return TargetDataset(), None


def run(base_url: str, log_path: str, loss_fn: str, loss_fn_config: dict[str, Any] | None) -> None:
    register_tokenizer(MODEL, lambda: TOKENIZER)  # type: ignore[arg-type,return-value]
    config = train.Config(
        learning_rate=0.05,
        dataset_builder=TargetDatasetBuilder(),
        model_name=MODEL,
        recipe_name="rlaas_cookbook_test",
        max_tokens=MAX_TOKENS,
        log_path=log_path,
        base_url=base_url,
        lora_rank=4,
        loss_fn=loss_fn,  # type: ignore[arg-type]
        loss_fn_config=loss_fn_config,
        eval_every=0,
        save_every=0,
        compute_post_kl=True,  # prompt logprobs of the new weights (score_sequences)
        kl_penalty_coef=0.01,  # prompt logprobs of the base (incorporate_kl_penalty)
        kl_reference_config=train.KLReferenceConfig(base_model=MODEL),
        num_groups_to_log=0,
        rollout_json_export=False,
    )
    asyncio.run(train.main(config))


if __name__ == "__main__":
    config_json = sys.argv[4] if len(sys.argv) > 4 else "null"
    run(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(config_json))

"""``dataset``: the tenant's own problems, one row of a JSONL file per episode.

The config is `rl_core.protocol.datasets.DatasetConfig` (its docstring shows it
in a spec). Each episode is one row: the prompt (a field, or a template of fields)
as the user message after the optional system message, the row's answer under
reset ``info["answer"]`` for the verifiers of ``environment.reward``
(`rl_core.rewards`: ``math``, ``exact``, ...). Without a ``reward``, the
environment's own reward is ``exact``'s.

Single-turn by default: the first reply ends the episode. With ``tools``
(``calculator``, ``python``) the model may call them, as in the ``calculator``
and ``code_exec`` environments (their tool implementations), for up to
``max_turns`` turns; the first reply without a tool call ends it.

Order. The rows of the train split are played in a seeded order: training task
``t`` (the collector's task index, read from the episode id) plays position
``t mod n`` of epoch ``t div n``, whose order is a permutation seeded by
(``seed``, epoch) (or the file's order without ``shuffle``). The collector's
tasks are resumable (a resumed run replays the tasks it had not trained and
starts new ones where it stopped), so a resumed run neither repeats nor skips a
row. Held-out task ``i`` plays the eval split's row ``i mod m``, never a train
row: without an eval split a held-out episode fails, saying so. Past ``epochs``
epochs, a reset fails the episode saying so.

Rows are read from the file by offset (found once per file, off the event
loop); the file is never held in memory whole.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import functools
import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rl_core.envs.base import Action, Message, Reset, Step, ToolCall
from rl_core.envs.calculator import TOOL as CALCULATOR_TOOL
from rl_core.envs.calculator import _run_tool as run_calculator
from rl_core.envs.code_exec import TOOL as PYTHON_TOOL
from rl_core.envs.code_exec import CodeExecConfig, describe
from rl_core.envs.episodes import episode_position
from rl_core.envs.procedural import ProceduralRows
from rl_core.envs.row_order import EpochOrder, held_out, held_out_row
from rl_core.envs.sandbox import run_python
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.datasets import DatasetConfig
from rl_core.rewards import RewardContext, verify_exact

_TOOL_SPECS = {"calculator": CALCULATOR_TOOL, "python": PYTHON_TOOL}
_PYTHON_LIMITS = CodeExecConfig().limits


class RowFile:
    """A JSONL file's rows by number, read by offset; its splits, fixed by the config."""

    def __init__(self, path: Path, cfg: DatasetConfig) -> None:
        self.path = path
        offsets = array.array("q")
        split_values: list[Any] = []
        field = cfg.split.field if cfg.split is not None else None
        with path.open("rb") as f:
            offset = 0
            for line in f:
                if line.strip():
                    offsets.append(offset)
                    if field is not None:
                        split_values.append(json.loads(line).get(field))
                offset += len(line)
        if not offsets:
            raise EnvironmentFailure(f"dataset: {path.name} has no rows")
        self.offsets = offsets
        everything = range(len(offsets))
        if cfg.split is None:
            self.train, self.eval = list(everything), []
        elif field is not None:
            held = {i for i in everything if str(split_values[i]) == cfg.split.value}
            self.train = [i for i in everything if i not in held]
            self.eval = sorted(held)
        else:
            order = list(everything)
            random.Random(f"{cfg.seed}:split").shuffle(order)
            n_eval = min(len(order) - 1, held_out(cfg.split, len(order)))
            self.eval, self.train = sorted(order[:n_eval]), sorted(order[n_eval:])
        if not self.train:
            raise EnvironmentFailure(
                f"dataset: the split leaves no training rows of {len(offsets)}; hold out fewer"
            )
        self._order = EpochOrder(self.train)

    def read(self, row: int) -> dict[str, Any]:
        with self.path.open("rb") as f:
            f.seek(self.offsets[row])
            value = json.loads(f.readline())
        if not isinstance(value, dict):
            raise EnvironmentFailure(f"dataset: row {row + 1} is not a JSON object")
        return value

    def train_row(self, task: int, cfg: DatasetConfig) -> int:
        """The row training task ``task`` plays: see the module docstring."""
        return self._order.row(task, cfg)

    def eval_row(self, index: int) -> int:
        return held_out_row(self.eval, index)


@dataclasses.dataclass
class _Episode:
    cfg: DatasetConfig
    answer: Any
    # A procedural source's own scorer of this row; None: `exact` against ``answer``.
    scorer: Callable[[str], float] | None = None
    turns: int = 0
    done: bool = False
    results: dict[int, Step] = dataclasses.field(default_factory=dict)


class DatasetEnv:
    """One instance serves many concurrent episodes, over any number of files and
    procedural sources."""

    name = "dataset"

    def __init__(self) -> None:
        self._files: dict[tuple[Any, ...], RowFile | ProceduralRows] = {}
        self._opening: dict[tuple[Any, ...], asyncio.Lock] = {}
        self._episodes: dict[str, _Episode] = {}

    def prepare(self, config: Mapping[str, Any]) -> None:
        """Build a procedural source now (the run's build calls it), so a task config that
        reasoning-gym refuses fails the run at its start; a file is opened at first use."""
        cfg = _parse(config)
        if cfg.task is not None:
            key = _procedural_key(cfg)
            if key not in self._files:
                self._files[key] = ProceduralRows(cfg)

    async def rows(self, cfg: DatasetConfig) -> RowFile | ProceduralRows:
        if cfg.task is not None:
            key = _procedural_key(cfg)
            async with self._opening.setdefault(key, asyncio.Lock()):
                if key not in self._files:  # reasoning-gym's import takes seconds: a thread
                    self._files[key] = await asyncio.to_thread(ProceduralRows, cfg)
            return self._files[key]
        if cfg.path is None:
            raise EnvironmentFailure(
                f"dataset: {cfg.dataset} has no local copy here; run it through the control "
                "plane (its worker fetches the content the run pinned), or give 'path'"
            )
        # The split and seed decide the splits and the order; other keys (prompt, tools) do not.
        key = (cfg.path, cfg.split, cfg.seed)
        found = self._files.get(key)
        if found is not None:
            return found
        async with self._opening.setdefault(key, asyncio.Lock()):
            if key not in self._files:
                path = Path(cfg.path)
                try:
                    self._files[key] = await asyncio.to_thread(RowFile, path, cfg)
                except (OSError, ValueError) as exc:
                    raise EnvironmentFailure(f"dataset: cannot read {path.name}: {exc}") from exc
        return self._files[key]

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = _parse(config)
        rows = await self.rows(cfg)
        # An id of the caller's own (not the collector's) plays the task its seed names.
        kind, index = episode_position(episode_id) or ("train", seed)
        number = rows.train_row(index, cfg) if kind == "train" else rows.eval_row(index)
        row = rows.read(number)
        answer = row.get(cfg.answer) if cfg.answer is not None else None
        messages: list[Message] = []
        if cfg.system:
            messages.append({"role": "system", "content": cfg.system})
        messages.append({"role": "user", "content": _prompt(cfg, row, number)})
        scorer = functools.partial(rows.score, number) if isinstance(rows, ProceduralRows) else None
        self._episodes[episode_id] = _Episode(cfg=cfg, answer=answer, scorer=scorer)
        info: dict[str, Any] = {"answer": answer, "row": number + 1, "split": kind}
        if isinstance(row.get("data_source"), str):
            info["data_source"] = row["data_source"]
        if cfg.tolerance is not None:
            info["tolerance"] = cfg.tolerance
        tools = [_TOOL_SPECS[name] for name in cfg.tools]
        return Reset(messages=messages, tools=tools, info=info)

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"dataset: no episode {episode_id!r}; call reset first")
        if step in episode.results:  # a retried step: same answer, no second tool run
            return episode.results[step]
        if episode.done:
            raise EnvironmentFailure(f"dataset: episode {episode_id!r} is already over")
        episode.turns += 1
        if action.tool_calls and episode.cfg.tools:
            messages = [await _tool(call, episode.cfg) for call in action.tool_calls]
            out_of_turns = episode.turns >= episode.cfg.max_turns
            result = Step(messages, 0.0, out_of_turns, {})
        else:
            result = Step([], _own_reward(action.content, episode), True, {})
        episode.done = result.done
        episode.results[step] = result
        return result

    async def close(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)


def _prompt(cfg: DatasetConfig, row: Mapping[str, Any], number: int) -> str:
    try:
        if "{" not in cfg.prompt:
            value = row[cfg.prompt]
            return value if isinstance(value, str) else json.dumps(value)
        return cfg.prompt.format_map({k: v for k, v in row.items() if isinstance(k, str)})
    except (KeyError, IndexError, ValueError) as exc:
        raise EnvironmentFailure(
            f"dataset: row {number + 1} has no field {exc} that the prompt reads"
        ) from None


def _parse(config: Mapping[str, Any]) -> DatasetConfig:
    try:
        return DatasetConfig.model_validate(dict(config))
    except ValidationError as exc:
        raise EnvironmentFailure(f"dataset: bad config: {exc}") from None


def _procedural_key(cfg: DatasetConfig) -> tuple[Any, ...]:
    # What decides a procedural source's rows and order; prompt, tools and the rest do not.
    task_config = json.dumps(cfg.dataset_config, sort_keys=True, default=str)
    return (cfg.dataset, task_config, cfg.size, cfg.split, cfg.seed)


def _own_reward(content: str, episode: _Episode) -> float:
    """The reward without ``environment.reward``: a procedural source's own scorer, else
    `exact` against the row's answer."""
    if episode.scorer is not None:
        return episode.scorer(content)
    if episode.answer is None:
        return 0.0
    ctx = RewardContext(
        contents=(content,), reference=episode.answer, env_reward=0.0, turns=1, info={}
    )
    return verify_exact(ctx)


async def _tool(call: ToolCall, cfg: DatasetConfig) -> Message:
    if call.name not in cfg.tools:
        content = f"error: unknown tool {call.name!r}; the tools are {', '.join(cfg.tools)}"
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}
    if call.name == "calculator":
        return run_calculator(call)
    code = call.arguments.get("code")
    if not isinstance(code, str):
        content = "error: python needs a string argument 'code'"
    else:
        content = describe(await run_python(code, _PYTHON_LIMITS))
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


__all__ = ["DatasetEnv", "RowFile"]

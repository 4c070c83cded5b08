"""The ``dataset`` environment: rows by a seeded, resumable order; splits; tools; scoring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rl_core.envs import build_environment
from rl_core.envs.base import Action, ToolCall
from rl_core.envs.dataset import DatasetEnv
from rl_core.envs.episodes import episode_position, eval_episode_id, train_episode_id
from rl_core.errors import EnvironmentFailure
from rl_core.spec import EnvironmentSpec

pytestmark = pytest.mark.anyio
N = 10


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    lines = [
        {"q": f"What is {i} * 3?", "a": str(3 * i), "split": "eval" if i >= 8 else "train"}
        for i in range(N)
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n", encoding="utf-8")
    return path


def config(path: Path, **overrides: Any) -> dict[str, Any]:
    return {"path": str(path), "prompt": "q", "answer": "a", **overrides}


async def row_of(env: DatasetEnv, episode_id: str, cfg: dict[str, Any]) -> int:
    reset = await env.reset(episode_id, 0, cfg)
    await env.close(episode_id)
    return int(reset.info["row"])


async def played(env: DatasetEnv, cfg: dict[str, Any], tasks: range) -> list[int]:
    return [await row_of(env, train_episode_id("run~a1-", t, 0), cfg) for t in tasks]


def test_episode_ids_say_which_task_or_held_out_episode() -> None:
    assert episode_position(train_episode_id("run_x~a2-", 17, 3)) == ("train", 17)
    assert episode_position(train_episode_id("p-", 4, 0, attempt=2)) == ("train", 4)
    assert episode_position(eval_episode_id("run_x~a1-", 20, 5)) == ("eval", 5)
    assert episode_position("my-own-id") is None


async def test_each_epoch_plays_every_row_once_in_a_seeded_order(rows_file: Path) -> None:
    cfg = config(rows_file, epochs=2)
    env = DatasetEnv()
    order = await played(env, cfg, range(2 * N))
    assert sorted(order[:N]) == sorted(order[N:]) == list(range(1, N + 1))
    assert order[:N] != order[N:] and order[:N] != list(range(1, N + 1))  # shuffled per epoch
    assert await played(DatasetEnv(), cfg, range(2 * N)) == order  # the same on any worker
    assert await played(DatasetEnv(), config(rows_file, seed=7), range(N)) != order[:N]
    unshuffled = await played(DatasetEnv(), config(rows_file, shuffle=False), range(N))
    assert unshuffled == list(range(1, N + 1))
    with pytest.raises(EnvironmentFailure, match="all 2 epochs"):
        await env.reset(train_episode_id("", 2 * N, 0), 0, cfg)


async def test_a_resumed_run_neither_repeats_nor_skips_rows(rows_file: Path) -> None:
    """The collector's rule: the resumed attempt replays its unconsumed tasks (here 6 and 7,
    in flight at the checkpoint) and goes on from next_index (8); rows follow the tasks."""
    cfg = config(rows_file)
    whole = await played(DatasetEnv(), cfg, range(N))
    before = await played(DatasetEnv(), cfg, range(6))
    replayed = [
        await row_of(DatasetEnv(), train_episode_id("run~a2-", t, 0, attempt=1), cfg)
        for t in (6, 7)
    ]
    after = await played(DatasetEnv(), cfg, range(8, N))
    assert before + replayed + after == whole


async def test_splits_hold_rows_out_of_training(rows_file: Path) -> None:
    env = DatasetEnv()
    by_field = config(rows_file, split={"field": "split"})
    train = set(await played(env, by_field, range(8)))
    held = {await row_of(env, eval_episode_id("", 0, i), by_field) for i in range(4)}
    assert train == set(range(1, 9)) and held == {9, 10}
    by_share = config(rows_file, split={"eval": 0.2})
    train = set(await played(env, by_share, range(8)))
    held = {await row_of(env, eval_episode_id("", 0, i), by_share) for i in range(2)}
    assert len(held) == 2 and not train & held and len(train | held) == N
    # A number of rows: the same seeded pick as a share of that many.
    by_size = config(rows_file, split={"size": 2})
    assert {await row_of(env, eval_episode_id("", 0, i), by_size) for i in range(2)} == held


async def test_prompt_template_system_and_the_answer_for_verifiers(rows_file: Path) -> None:
    env = DatasetEnv()
    cfg = config(rows_file, prompt="Compute: {q} Box it.", system="Be brief.", shuffle=False)
    reset = await env.reset(train_episode_id("", 4, 0), 0, cfg)
    assert reset.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Compute: What is 4 * 3? Box it."},
    ]
    assert reset.info["answer"] == "12" and reset.tools == []
    step = await env.step(train_episode_id("", 4, 0), 0, Action(content="\\boxed{12}"))
    assert step.done and step.reward == 1.0  # its own reward without `reward:`: exact


async def test_with_a_verifier_attached(rows_file: Path) -> None:
    spec = EnvironmentSpec(name="dataset", reward="math", config=config(rows_file, shuffle=False))
    env = build_environment(spec)
    episode = train_episode_id("", 5, 0)
    await env.reset(episode, 0, spec.config)
    step = await env.step(episode, 0, Action(content="5 * 3 = \\boxed{15}"))
    assert step.reward == 1.0 and step.info["reward_terms"] == {"math": 1.0}


async def test_tools_make_it_multi_turn(rows_file: Path) -> None:
    env = DatasetEnv()
    cfg = config(rows_file, tools=["calculator", "python"], shuffle=False)
    episode = train_episode_id("", 7, 0)
    reset = await env.reset(episode, 0, cfg)
    assert [t["function"]["name"] for t in reset.tools] == ["calculator", "python"]
    calc = ToolCall(id="c1", name="calculator", arguments={"expression": "7 * 3"})
    first = await env.step(episode, 0, Action(content="", tool_calls=(calc,)))
    assert not first.done and first.messages[0]["content"] == "21"
    code = ToolCall(id="c2", name="python", arguments={"code": "print(7 * 3)"})
    second = await env.step(episode, 1, Action(content="", tool_calls=(code,)))
    assert "stdout:\n21" in second.messages[0]["content"]
    last = await env.step(episode, 2, Action(content="21"))
    assert last.done and last.reward == 1.0


async def test_without_a_local_copy_it_says_how_to_run_it(rows_file: Path) -> None:
    with pytest.raises(EnvironmentFailure, match="no local copy"):
        await DatasetEnv().reset("e", 0, {"dataset": "ds_" + "0" * 32, "prompt": "q"})
    with pytest.raises(EnvironmentFailure, match="bad config"):
        await DatasetEnv().reset("e", 0, config(rows_file, prompt=""))


async def test_without_an_eval_split_a_held_out_episode_fails_not_a_training_row(
    rows_file: Path,
) -> None:
    with pytest.raises(EnvironmentFailure, match="holds none out; give split"):
        await DatasetEnv().reset(eval_episode_id("", 0, 0), 0, config(rows_file))
    # A field split that matches no row holds none out either.
    none_held = config(rows_file, split={"field": "split", "value": "test"})
    with pytest.raises(EnvironmentFailure, match="holds none out"):
        await DatasetEnv().reset(eval_episode_id("", 0, 0), 0, none_held)

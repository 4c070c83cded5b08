"""``openenv``: a real OpenEnv server (openenv-core's own ``create_app``, on loopback) played
through its ``/ws`` sessions: text and tool-call actions, rewards and done, the allowlist,
the signature a proxy in front can check, and a pipeline run whose rewards the server paid.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rl_core.envs import Action, ToolCall, WebhookTarget, build_environment
from rl_core.envs.errors import WebhookAddressRefused, WebhookUnavailable
from rl_core.envs.openenv import OpenEnvEnvironment
from rl_core.errors import EnvironmentFailure, UnknownEnvironment
from rl_core.protocol.addresses import Allowlist
from rl_core.protocol.ecosystem import OpenEnvConfig
from rl_core.spec import EnvironmentSpec
from tests.rl_core.envs.openenv_server import PAID, SignedOnly, bare_say_server, say_server
from tests.rl_core.envs.test_reasoning_gym import Configured
from tests.rl_core.pipeline.conftest import run_pipeline

SECRET = "openenv-secret-0123456789"
TEXT = {"environment": "env_say", "observation_field": "prompt"}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, SignedOnly]]:
    with say_server(SECRET) as served:
        yield served


def make(url: str, config: dict[str, Any], secret: str = SECRET, **target: Any) -> Any:
    hooks = {"env_say": WebhookTarget(id="env_say", url=url, secret=secret, **target)}
    return build_environment(EnvironmentSpec(name="openenv", config=config), webhooks=hooks)


def test_text_actions_play_an_episode_on_one_session(server: tuple[str, SignedOnly]) -> None:
    async def main() -> None:
        env = make(server[0], {**TEXT, "instructions": "Repeat the number."})
        assert isinstance(env, OpenEnvEnvironment)
        reset = await env.reset("ep-text", 4, {})  # 4 % 3 == 1
        assert reset.messages == [{"role": "user", "content": "Repeat the number.\n\nSay 1"}]
        assert reset.tools == []
        wrong = await env.step("ep-text", 1, Action(content="2"))
        assert (wrong.reward, wrong.done) == (0.0, False)
        assert wrong.messages == [{"role": "user", "content": "Say 1"}]
        assert await env.step("ep-text", 1, Action(content="1")) == wrong  # retried: same
        right = await env.step("ep-text", 2, Action(content="1"))
        assert (right.reward, right.done) == (1.0, True)
        # The server's instance kept the number between the steps: one session per episode.
        assert PAID["ep-text"] == [0.0, 1.0]
        with pytest.raises(EnvironmentFailure, match="already over"):
            await env.step("ep-text", 3, Action(content="1"))
        await env.close("ep-text")
        await env.aclose()

    asyncio.run(main())


def test_the_whole_observation_and_reset_arguments(server: tuple[str, SignedOnly]) -> None:
    async def main() -> None:
        env = make(server[0], {"environment": "env_say", "reset": {"prefix": "Utter"}})
        reset = await env.reset("ep-json", 2, {})
        assert reset.messages[0]["content"] == '{"heard": "", "prompt": "Utter 2"}'
        await env.aclose()

    asyncio.run(main())


def test_tool_call_actions_take_the_servers_action_schema(
    server: tuple[str, SignedOnly],
) -> None:
    async def main() -> None:
        env = make(server[0], {**TEXT, "action_mode": "tool_call", "tool_name": "say"})
        reset = await env.reset("ep-tool", 0, {})
        (tool,) = reset.tools
        assert tool["function"]["name"] == "say"
        params = tool["function"]["parameters"]
        assert set(params["properties"]) == {"message"} and params["required"] == ["message"]
        hint = await env.step("ep-tool", 1, Action(content="0"))  # text, no call
        assert hint.reward == 0.0 and not hint.done and "say tool" in hint.messages[0]["content"]
        call = ToolCall(id="c1", name="say", arguments={"message": "0"})
        paid = await env.step("ep-tool", 2, Action(content="", tool_calls=(call,)))
        assert paid.reward == 1.0
        assert paid.messages == [{"role": "tool", "tool_call_id": "c1", "content": "Say 0"}]
        assert PAID["ep-tool"] == [1.0]  # the hint never reached the server
        await env.aclose()

    asyncio.run(main())


def test_an_action_the_server_refuses_names_the_mapping(server: tuple[str, SignedOnly]) -> None:
    async def main() -> None:
        env = make(server[0], {**TEXT, "action_field": "text"})
        await env.reset("ep-bad", 0, {})
        with pytest.raises(EnvironmentFailure, match=r"VALIDATION_ERROR.*action_field"):
            await env.step("ep-bad", 1, Action(content="0"))
        await env.aclose()

    asyncio.run(main())


def test_the_walls_of_webhooks_apply(server: tuple[str, SignedOnly]) -> None:
    url, signed_only = server

    async def main() -> None:
        # Loopback is not allowed on a server's default allowlist: no connection is made.
        public = make(url, TEXT, allowlist=Allowlist.parse("public", embedded=False))
        with pytest.raises(WebhookAddressRefused, match="refused to connect"):
            await public.reset("ep-wall", 0, {})
        # A proxy holding the registered secret refuses an upgrade signed with another.
        before = signed_only.refused
        forged = make(url, TEXT, secret="not-the-registered-secret")
        with pytest.raises(WebhookUnavailable, match="refused the WebSocket"):
            await forged.reset("ep-forged", 0, {})
        assert signed_only.refused == before + 1
        await public.aclose()
        await forged.aclose()

    asyncio.run(main())


def test_a_local_run_names_the_servers_url() -> None:
    async def main(url: str) -> None:
        spec = EnvironmentSpec(name="openenv", config={"url": url, "observation_field": "prompt"})
        env = build_environment(spec)  # no control plane, no registered secret: unsigned
        assert (await env.reset("ep-local", 5, {})).messages[0]["content"] == "Say 2"
        assert (await env.step("ep-local", 1, Action(content="2"))).reward == 1.0
        await env.aclose()

    with bare_say_server() as url:
        asyncio.run(main(url))


def test_a_run_names_a_registered_server() -> None:
    with pytest.raises(UnknownEnvironment, match=r"environment\.config\.environment"):
        build_environment(EnvironmentSpec(name="openenv", config=TEXT), webhooks={})
    with pytest.raises(EnvironmentFailure, match=r"environment\.config\.action_mode"):
        build_environment(
            EnvironmentSpec(name="openenv", config={**TEXT, "action_mode": "json"}), webhooks={}
        )
    assert OpenEnvConfig.model_validate(TEXT).action_field == "message"


def test_a_run_trains_on_the_rewards_the_server_paid(server: tuple[str, SignedOnly]) -> None:
    # The real collector, agent and pipeline; the engine says "1" every turn.
    env = make(server[0], TEXT)
    run = run_pipeline(steps=2, batch_groups=2, group_size=3, env=Configured(env, TEXT))
    assert run.result.steps_completed == 2
    trained = [t for batch in run.trainer.batches for g in batch for t in g.trajectories]
    assert len(trained) == 12
    for traj in trained:
        assert traj.end_state == "done" and traj.turns == 2
        assert traj.turn_rewards == PAID[traj.episode_id]
    assert {t.reward for t in trained} <= {0.0, 2.0}  # "1" is right for a whole episode or none

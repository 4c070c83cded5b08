"""``code_exec``: write a Python function, with a sandboxed ``python`` tool to try code.

Each episode is one task of `rl_core.envs.code_tasks` (drawn from the reset
seed). The model may call ``python`` (its ``code`` runs in `sandbox`; stdout,
stderr and the exit status come back as the tool message) any number of
times, then answers with the function in a fenced code block. The answer
runs in the sandbox followed by the task's checker; the reward is the
fraction of test cases passed (``partial_credit``), or 1 only if all pass.
The checker's result line carries a random marker the model's code cannot
read, so printing a fake result earns nothing.

The host's `rl_core.envs.walls.WallPolicy` decides whether the model's code may run
here: under `MULTI_TENANT` (a deployed worker) without bubblewrap, the first reset
raises `SandboxRefused` and the run fails with the operator's fix; under a policy that
accepts a weaker wall, each episode's info carries ``sandbox_warning``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import secrets
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Message, Reset, Step, ToolCall
from rl_core.envs.code_tasks import BY_NAME, CodeTask, checker_source, passed_cases
from rl_core.envs.config import parse_config
from rl_core.envs.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python
from rl_core.envs.walls import SINGLE_USER, WallPolicy, WallReport, assess
from rl_core.errors import EnvironmentFailure, SandboxRefused

log = logging.getLogger(__name__)

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code (standard library only, no network) and see its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "a Python program"}},
            "required": ["code"],
        },
    },
}
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


# What a spec may set each sandbox limit to: enough for a test-sized program, not enough
# to hold a worker (a run's episodes share its cores and memory).
_LIMIT_RANGES: tuple[tuple[str, float, float], ...] = (
    ("wall_s", 0.1, 30.0),
    ("cpu_s", 1, 30),
    ("memory_mb", 32, 2048),
    ("output_bytes", 256, 64 * 1024),
    ("max_turns", 1, 16),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeExecConfig:
    tasks: tuple[str, ...] | list[str] | None = None  # names; None: all of them
    max_turns: int = 4
    partial_credit: bool = True
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 256
    output_bytes: int = 4096
    tool_hint: bool = True  # spell out the tool-call format (see calculator.py for why)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.tasks or ()) - set(BY_NAME))
        if unknown or self.tasks == []:
            raise ValueError(f"unknown tasks {unknown}; known: {sorted(BY_NAME)}")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        for field, low, high in _LIMIT_RANGES:
            value = getattr(self, field)
            if not low <= value <= high:
                raise ValueError(
                    f"{field} must be from {low} to {high} (the sandbox's caps: a tenant's "
                    f"program may not ask for more of the worker); got {value}"
                )

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            memory_bytes=self.memory_mb * 2**20,
            output_bytes=self.output_bytes,
        )


def best_blind_reward(config: CodeExecConfig) -> float:
    """The best expected reward of a policy that reads no observation: the optimum, 1.

    Not a bar any learning test can clear. The task set is finite and its test cases are
    fixed, so one fixed answer that defines every task's function (each a lookup table
    of its cases) passes every case of whichever task is drawn
    (`tests/rl_core/envs/test_code_exec.py` plays it). Showing that a policy reads the
    task needs tasks drawn from a space too large to answer in one reply, as
    ``next_number`` and ``guess_number`` are.
    """
    return 1.0


@dataclasses.dataclass
class _Episode:
    config: CodeExecConfig
    task: CodeTask
    turns: int = 0
    done: bool = False
    results: dict[int, Step] = dataclasses.field(default_factory=dict)


class CodeExec:
    """``walls``: what this host accepts (`rl_core.envs.walls`); the default is a
    single-user machine's. A deployed worker passes `MULTI_TENANT` or the operator's opt-out."""

    name = "code_exec"

    def __init__(self, walls: WallPolicy = SINGLE_USER) -> None:
        self._episodes: dict[str, _Episode] = {}
        self._policy = walls
        self._report: WallReport | None = None

    def _wall(self) -> WallReport:
        """The host's wall, assessed at the first reset (the probes run once per process)."""
        if self._report is None:
            self._report = assess(self._policy)
            if self._report.weak:
                log.warning("code_exec: %s", self._report.message)
        if self._report.tenant_code == "refused":
            raise SandboxRefused(self._report.message)
        return self._report

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        wall = self._wall()  # before anything of the tenant's is looked at
        cfg = parse_config(CodeExecConfig, config, self.name)
        names = sorted(cfg.tasks) if cfg.tasks else sorted(BY_NAME)
        task = BY_NAME[random.Random(seed).choice(names)]
        self._episodes[episode_id] = _Episode(config=cfg, task=task)
        prompt = f"{task.prompt} You may run code with the python tool. "
        if cfg.tool_hint:
            call = json.dumps({"name": "python", "arguments": {"code": "print(1 + 1)"}})
            prompt += f"To use it, write <tool_call>{call}</tool_call> and wait for the output. "
        prompt += "When you are done, reply with the complete function in a ```python code block."
        info: dict[str, Any] = {"task": task.name, "isolation": wall.wall}
        if wall.weak:
            info["sandbox_warning"] = wall.message
        return Reset(messages=[{"role": "user", "content": prompt}], tools=[TOOL], info=info)

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"code_exec: no episode {episode_id!r}; call reset first")
        if step in episode.results:  # a retried step: same answer, no second run
            return episode.results[step]
        if episode.done:
            raise EnvironmentFailure(f"code_exec: episode {episode_id!r} is already over")
        episode.turns += 1
        out_of_turns = episode.turns >= episode.config.max_turns
        if action.tool_calls:
            messages = [await self._tool(call, episode.config) for call in action.tool_calls]
            result = Step(messages, 0.0, out_of_turns, {"passed": 0})
        else:
            result = await self._judge(episode, action.content, out_of_turns)
        episode.done = result.done
        episode.results[step] = result
        return result

    async def close(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)

    async def _run(self, code: str, cfg: CodeExecConfig, checker: str = "") -> SandboxResult:
        limits = cfg.limits
        if self._policy.weak_wall == "refuse":
            # bubblewrap or nothing: should it stop working mid-run, no silent fallback.
            limits = dataclasses.replace(limits, network="bwrap")
        try:
            return await run_python(code, limits, checker=checker)
        except SandboxUnavailable as exc:
            raise SandboxRefused(f"sandbox wall: {exc}; this worker refuses tenant code") from exc

    async def _tool(self, call: ToolCall, cfg: CodeExecConfig) -> Message:
        code = call.arguments.get("code")
        if call.name != "python":
            content = f"error: unknown tool {call.name!r}; the only tool is 'python'"
        elif not isinstance(code, str):
            content = "error: python needs a string argument 'code'"
        else:
            content = describe(await self._run(code, cfg))
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}

    async def _judge(self, episode: _Episode, content: str, out_of_turns: bool) -> Step:
        blocks = _FENCE.findall(content)
        if not blocks:
            reply = "Reply with the complete function in a ```python code block."
            return Step([{"role": "user", "content": reply}], 0.0, out_of_turns, {"passed": 0})
        marker = f"__rlaas_{secrets.token_hex(8)}__"
        run = await self._run(
            blocks[-1], episode.config, checker=checker_source(episode.task, marker)
        )
        passed, total = _score(run.stdout, marker, episode.task)
        reward = passed / total if episode.config.partial_credit else float(passed == total)
        info: dict[str, object] = {"passed": passed, "total": total, "solved": passed == total}
        info["isolation"] = run.isolation  # which wall stood (bwrap where it runs)
        return Step([], reward, True, info)


def _score(stdout: str, marker: str, task: CodeTask) -> tuple[int, int]:
    total = len(task.cases)
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            try:
                return passed_cases(task, json.loads(line[len(marker) :])), total
            except ValueError:
                return 0, total
    return 0, total  # the program died, timed out or hid the checker's line


def describe(run: SandboxResult) -> str:
    """The tool message for one run: its output and how it ended."""
    parts = []
    if run.stdout:
        parts.append(f"stdout:\n{run.stdout}")
    if run.stderr:
        parts.append(f"stderr:\n{run.stderr}")
    if run.killed_by == "wall_time":
        parts.append("killed: wall-time limit reached")
    elif run.killed_by == "cpu_time":
        parts.append("killed: CPU-time limit reached")
    elif run.killed_by == "output":
        parts.append("killed: output limit reached (output truncated)")
    parts.append(f"exit code: {run.exit_code}")
    return "\n".join(parts)

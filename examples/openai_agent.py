"""An ordinary tool-using agent written against the ``openai`` package, trained by rlaas.

    .venv/bin/python examples/openai_agent.py --out runs/openai-agent [--spec SPEC] [--agents 8]

Starts ``rlaas train`` on ``examples/openai-agent.yaml`` (environment ``sessions``) and,
while it runs, plays episodes: each is a session (`sdk.sessions`), an arithmetic
question, a ``calculator`` tool the model may call, and a reward of 1 when the final
answer holds the right number. Sessions of one question share a group (GRPO compares
them). Nothing here knows it is being trained except the three session calls: open,
``session.openai()``, end.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sdk.sessions import Session, SessionGateway

HERE = Path(__file__).resolve().parent
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_TURNS = 3


def calculate(expression: str) -> str:
    """The tool: arithmetic only (no names, no calls), so the model cannot run code here."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers and + - * are allowed")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def task(index: int) -> tuple[str, int]:
    rng = random.Random(index)
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    op = rng.choice("+-*")
    return f"What is {a} {op} {b}?", int(calculate(f"{a} {op} {b}"))


def play(session: Session, question: str, answer: int) -> float:
    """The agent loop: ask, run the tools the model calls, stop at an answer in words."""
    client = session.openai(max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            numbers = re.findall(r"-?\d+", (message.content or "").replace(",", ""))
            return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = calculate(str(expression)) if expression else "error: no expression"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0  # no answer within the turns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/openai-agent"))
    parser.add_argument("--spec", type=Path, default=HERE / "openai-agent.yaml")
    parser.add_argument("--agents", type=int, default=8, help="episodes played at once")
    args = parser.parse_args()
    (args.out / "sessions.json").unlink(missing_ok=True)  # a file left by an earlier run
    train = subprocess.Popen(
        [sys.executable, "-m", "sdk.cli", "train", str(args.spec), "--out", str(args.out)]
    )
    gateway = SessionGateway.from_folder(args.out, wait_s=600)
    group_size = 8
    lock, rewards = threading.Lock(), []

    def serving() -> bool:  # the run removes sessions.json when its gateway closes
        return train.poll() is None and (args.out / "sessions.json").exists()

    def episode(index: int) -> None:
        question, answer = task(index // group_size)
        try:
            with gateway.open(group=f"task-{index // group_size}", wait_s=120) as session:
                reward = play(session, question, answer)
                session.end(reward)
        except Exception as exc:  # the run ended under it, or the agent failed
            if serving():
                print(f"episode {index}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return
        with lock:
            rewards.append(reward)
            if len(rewards) % 32 == 0:
                print(f"{len(rewards)} episodes, last 32 solved {sum(rewards[-32:]) / 32:.2f}")

    with ThreadPoolExecutor(args.agents) as pool:
        index = 0
        while serving():
            list(pool.map(episode, range(index, index + args.agents)))
            index += args.agents
    return train.wait()


if __name__ == "__main__":
    sys.exit(main())

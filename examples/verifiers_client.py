"""A verifiers ``ToolEnv`` trained by rlaas: its dataset, tool and rubric, unchanged.

    rlaas train examples/verifiers-toolenv.yaml --out runs/verifiers-toolenv &
    .venv/bin/python examples/verifiers_client.py runs/verifiers-toolenv

verifiers evaluates its environment against ONE endpoint: the run's shared URL. Each
rollout's calls name their session with verifiers' own header (``X-Session-ID``, the
rollout's ``trajectory_id``) and their GRPO group (``X-Session-Group``, the
``example_id``); the session opens on its first call. After each round, every
rollout's rubric reward ends its session.
"""

from __future__ import annotations

import asyncio
import os
import sys

import verifiers as vf
from datasets import Dataset

from sdk.errors import RlaasError
from sdk.sessions import SessionGateway


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def right_sum(completion: list, answer: str) -> float:
    """1 when the last message holds the answer."""
    return float(bool(completion) and answer in str(completion[-1].get("content") or ""))


def main(out: str) -> None:
    gateway = SessionGateway.from_folder(out, wait_s=600)
    os.environ["RLAAS_RUN_TOKEN"] = gateway.token
    rows = [
        {"example_id": i, "question": f"What is {i} + {2 * i}?", "answer": str(3 * i)}
        for i in range(1, 200)
    ]
    env = vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows),
        tools=[add],
        rubric=vf.Rubric(funcs=[right_sum]),
        max_turns=3,
    )
    client = vf.ClientConfig(
        api_base_url=gateway.shared_url,
        api_key_var="RLAAS_RUN_TOKEN",
        extra_headers_from_state={"X-Session-ID": "trajectory_id", "X-Session-Group": "example_id"},
    )
    while True:
        results = asyncio.run(
            env.evaluate(
                client=client,
                model="policy",
                num_examples=8,
                rollouts_per_example=4,  # the spec's group_size
                shuffle=True,
                state_columns=["trajectory_id"],
            )
        )
        try:
            for output in results["outputs"]:
                if output.get("error") is not None:
                    gateway.cancel(output["trajectory_id"])
                else:
                    gateway.end(output["trajectory_id"], reward=float(output["reward"]))
        except RlaasError as exc:  # the run ended
            print(exc)
            return
        print("mean reward", sum(o["reward"] for o in results["outputs"]) / len(results["outputs"]))


if __name__ == "__main__":
    main(sys.argv[1])

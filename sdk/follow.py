"""Follow a run in the terminal: a progress bar over steps and the live reward."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sdk.client import Client, Run

REWARD = "reward/mean"


def follow_run(client: Client, run_id: str, *, interval_s: float = 1.0) -> Run:
    """Poll the run until it ends, drawing progress; returns the final run."""
    console = Console(stderr=True)
    run = client.get_run(run_id)
    total = int(run.raw.get("spec", {}).get("train", {}).get("steps", 0)) or None
    rewards: list[float] = []
    last_step = 0
    with Progress(
        TextColumn("[bold]{task.fields[status]:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("{task.fields[trend]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("run", total=total, status=run.status, reward="-", trend="")
        while True:
            run = client.get_run(run_id)
            for point in client.metrics(run_id, name=REWARD, since_step=last_step + 1):
                rewards.append(point.value)
                last_step = max(last_step, point.step)
            progress.update(
                task,
                completed=run.current_step,
                status=run.status,
                reward=f"{rewards[-1]:.3f}" if rewards else "-",
                trend=sparkline(rewards[-40:]),
            )
            if run.done:
                break
            time.sleep(interval_s)
    if rewards:
        console.print(
            f"reward/mean: first {rewards[0]:.3f}, best {max(rewards):.3f}, last {rewards[-1]:.3f}"
        )
    if run.error:
        console.print(f"[red]error:[/red] {run.error}")
    return run


def sparkline(values: list[float]) -> str:
    """A one-line chart of the values, scaled to their own range."""
    if not values:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(blocks[int((v - low) / span * (len(blocks) - 1))] for v in values)

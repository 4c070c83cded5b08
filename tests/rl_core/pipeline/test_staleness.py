"""The staleness bound, admission control, and the drop/requeue policy for stragglers."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from rl_core.agent.agent import AgentConfig
from rl_core.agent.ledger import Trajectory
from rl_core.pipeline.batch import fresh_mask
from rl_core.pipeline.queue import Group

from .conftest import Behaviour, RecordingTrainer, ScriptEnv, parse_id, run_pipeline, seeded_delays


def trained_versions(group: Group) -> list[int]:
    """The versions of the model calls the trainer trained on in this group."""
    return [v for t in group.to_train for v in t.turn_versions if v >= group.fresh_from]


def assert_bound_holds(run: object, max_staleness: int) -> None:
    for step, batch in run.trained():  # type: ignore[attr-defined]
        for group in batch:
            assert group.fresh_from == (step - 1) - max_staleness
            for version in trained_versions(group):
                assert 0 <= (step - 1) - version <= max_staleness


@pytest.mark.parametrize(
    ("seed", "max_staleness", "batch_groups", "group_size", "policy", "trainer_s"),
    [
        (0, 0, 2, 2, "drop", 0.0),
        (1, 1, 2, 3, "drop", 0.01),
        (2, 1, 3, 2, "requeue", 0.0),
        (3, 2, 2, 2, "requeue", 0.02),
        (4, 3, 1, 4, "drop", 0.005),
        (5, 2, 4, 2, "drop", 0.0),
    ],
)
def test_trained_data_is_never_staler_than_the_bound(
    seed: int,
    max_staleness: int,
    batch_groups: int,
    group_size: int,
    policy: str,
    trainer_s: float,
) -> None:
    run = run_pipeline(
        steps=6,
        batch_groups=batch_groups,
        group_size=group_size,
        max_staleness=max_staleness,
        policy=policy,
        env=ScriptEnv(seeded_delays(seed, 0.03)),
        trainer=RecordingTrainer(delay_s=trainer_s),
    )
    assert run.result.steps_completed == 6
    for _, batch in run.trained():
        # B groups' worth of episodes: a group sent in two parts counts once in all.
        episodes = sum(g.members for g in batch)
        assert batch_groups * group_size <= episodes < (batch_groups + 1) * group_size
    assert_bound_holds(run, max_staleness)
    # Admission by episode: never more than C unfinished when a group starts.
    admission = run.pipeline.admission
    assert admission.peak_unfinished <= 64 + group_size - 1
    assert max(run.metrics("staleness/max")) <= max_staleness
    for (_, m), (_, batch) in zip(run.sink.steps, run.trained(), strict=True):
        buckets = sum(m[f"staleness/bucket_{k}"] for k in range(max_staleness + 1))
        assert buckets == sum(len(g.trainable(g.fresh_from)) for g in batch)
    # No episode trained twice (a group sent in two parts trains each member once).
    episodes = [t.episode_id for _, batch in run.trained() for g in batch for t in g.to_train]
    assert len(episodes) == len(set(episodes))


def straggling(trainer: RecordingTrainer) -> Callable[[int, int, int], Behaviour]:
    """Task 0's first attempt ends only once the trainer has made two updates: its calls
    (policy 0) are then two versions old, past a bound of 1, however fast the host is."""

    def plan(task: int, member: int, attempt: int) -> Behaviour:
        if task == 0 and attempt == 0:
            return Behaviour(until=lambda: trainer.updates >= 2)
        return Behaviour(delay_s=0.002)

    return plan


def test_a_stale_straggler_is_dropped_never_trained() -> None:
    trainer = RecordingTrainer()
    run = run_pipeline(
        steps=6,
        max_staleness=1,
        policy="drop",
        env=ScriptEnv(straggling(trainer)),
        trainer=trainer,
        episode_timeout_s=None,  # the straggler waits on an event, not on the host's speed
    )
    trained = {g.task.index for _, batch in run.trained() for g in batch}
    assert 0 not in trained
    assert sum(run.metrics("groups/dropped_stale")) == 1
    assert sum(run.metrics("groups/requeued")) == 0


def test_a_stale_straggler_is_requeued_and_replayed_under_a_fresh_policy() -> None:
    trainer = RecordingTrainer()
    # Orderings, not timings: the straggler waits on the trainer (no episode timeout to
    # race a loaded host), and 30 steps leave the replay room to come round however the
    # host schedules it. The replay may reach the trainer whole or in two parts (a member
    # of it straggling past the bound on a loaded host is split off, as any group is).
    run = run_pipeline(
        steps=30,
        max_staleness=1,
        policy="requeue",
        env=ScriptEnv(straggling(trainer)),
        trainer=trainer,
        episode_timeout_s=None,
    )
    replayed = [(step, g) for step, batch in run.trained() for g in batch if g.task.index == 0]
    assert replayed, "the requeued task was never trained"
    # Only a replay is trained, never the first attempt's episodes (their calls are stale),
    # and one attempt's members once each, whether in one part or two.
    attempts = {g.task.attempt for _, g in replayed}
    assert len(attempts) == 1 and attempts.pop() >= 1
    trained = [t for _, g in replayed for t in g.to_train]
    assert all(parse_id(t.episode_id)[2] >= 1 for t in trained)
    assert len({t.member for t in trained}) == len(trained)
    for step, group in replayed:
        assert all((step - 1) - t.policy_version <= 1 for t in group.trainable(group.fresh_from))
    # Requeued (again only if the replay itself straggled past the bound), not dropped: a
    # drop here can only be the stale rest of a group split on a loaded host.
    assert sum(run.metrics("groups/requeued")) >= 1
    assert sum(run.metrics("groups/dropped_stale")) <= sum(run.metrics("groups/split"))


def test_sync_admission_starts_one_batch_per_policy() -> None:
    run = run_pipeline(
        steps=4,
        batch_groups=2,
        group_size=2,
        mode="sync",
        env=ScriptEnv(seeded_delays(7, 0.02)),
    )
    assert run.pipeline.admission.peak_outstanding <= 2
    assert_bound_holds(run, 0)


def long_tail(task: int, member: int, attempt: int) -> Behaviour:
    """Episodes of 1 to 24 turns, lognormal (median 4), each step 2-5 ms: a few run many
    times longer than a train step, none has a single step that long."""
    rng = random.Random(task * 1000 + member)
    turns = min(24, max(1, round(rng.lognormvariate(1.4, 0.9))))
    return Behaviour(turns=turns, delay_s=rng.uniform(0.002, 0.005))


def test_a_long_tail_run_trains_on_every_episode_it_finishes() -> None:
    """Admission by episode keeps C episodes in flight while stragglers run, and the gate
    masks only a straggler's old calls: no finished episode of a consumed group is left
    untrained, no group is dropped, and no trained token is older than the bound."""
    concurrency, group_size = 16, 4
    run = run_pipeline(
        steps=30,
        batch_groups=2,
        group_size=group_size,
        max_staleness=1,
        policy="drop",
        env=ScriptEnv(long_tail),
        trainer=RecordingTrainer(delay_s=0.002),
        agent=AgentConfig(max_turns=24, max_new_tokens=4, max_context=512, env_timeout_s=5.0),
        concurrency=concurrency,
    )
    assert run.result.steps_completed == 30
    assert_bound_holds(run, 1)
    kept = [t for _, batch in run.trained() for g in batch for t in g.to_train]
    trained = [t for _, batch in run.trained() for g in batch for t in g.trainable(g.fresh_from)]
    untrained = sum(run.metrics("stale/episodes_untrained"))
    print(
        f"kept {len(kept)} trained {len(trained)} untrained {untrained:.0f} "
        f"calls masked {sum(run.metrics('stale/calls_masked')):.0f} "
        f"groups dropped {sum(run.metrics('groups/dropped_stale')):.0f}"
    )
    assert len(trained) + untrained == len(kept)
    assert untrained <= 0.01 * len(kept)  # each counted by reason (stale/episodes_untrained)
    assert sum(run.metrics("groups/dropped_stale")) == 0
    # The bound did bite: groups went to the trainer in two parts, ahead of stragglers.
    assert sum(run.metrics("groups/split")) > 0
    straddling = [t for t in trained if t.oldest_version < t.newest_version]
    assert straddling, "no episode ran across a weight update"
    assert max(len(t.turn_versions) for t in trained) >= 12  # the longest are trained
    # Admission by episode: the collector kept C episodes unfinished.
    assert run.pipeline.admission.peak_unfinished >= concurrency


def test_fresh_mask_drops_only_the_tokens_of_stale_calls() -> None:
    t = Trajectory(episode_id="g0-e0")
    t.sample.append_observation([1, 2])
    t.sample.append_model([3, 4], [-0.1, -0.2], 0)
    t.sample.append_observation([5])
    t.sample.append_model([6], [-0.3], 1)
    t.turn_versions = [3, 5]
    assert fresh_mask(t.sample, t.turn_versions, 3) == [0, 0, 1, 1, 0, 1]
    assert fresh_mask(t.sample, t.turn_versions, 4) == [0, 0, 0, 0, 0, 1]
    assert fresh_mask(t.sample, t.turn_versions, 6) == [0, 0, 0, 0, 0, 0]

"""The readable trajectories of a step: how many, which, and what reads as trained."""

from __future__ import annotations

from rl_core.agent.ledger import Sample, Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.queue import Group, GroupTask
from rl_core.pipeline.reported import trained_records, untrained_records

TOK = BuiltinTokenizer()


def episode(group: int, member: int, versions: list[int], state: str = "done") -> Trajectory:
    """An episode of one model call per version in ``versions``, after a prompt."""
    sample = Sample()
    sample.append_observation(TOK.encode("Q"))
    for turn, _ in enumerate(versions):
        sample.append_model(TOK.encode("A"), [-0.5] * len(TOK.encode("A")), turn=turn)
        sample.append_observation(TOK.encode("ok"))
    traj = Trajectory(
        episode_id=f"g{group}-e{member}",
        group=group,
        member=member,
        samples=[sample],
        turns=len(versions),
        turn_versions=versions,
        policy_version=min(versions),
    )
    traj.end(state, None)  # type: ignore[arg-type]
    return traj


def test_a_step_reports_n_trained_episodes_taken_across_its_groups_in_turn() -> None:
    groups = [
        Group(task=GroupTask(i), trajectories=[episode(i, m, [0]) for m in range(4)])
        for i in (3, 1)
    ]
    records = trained_records(groups, TOK, step=2, n=5)
    # Each group's first member, then each group's second, ...; tasks in order.
    assert [r.episode_id for r in records] == ["g1-e0", "g3-e0", "g1-e1", "g3-e1", "g1-e2"]
    assert all(r.step == 2 for r in records)
    # One group: still n of its members (the issue: one row a step for batch_groups 1).
    assert len(trained_records(groups[:1], TOK, step=2, n=3)) == 3


def test_trained_reads_as_the_loss_mask_had_it_stale_calls_included() -> None:
    # Two calls, sampled at versions 0 and 2; the gate trained from version 1 on.
    group = Group(task=GroupTask(0), trajectories=[episode(0, 0, [0, 2]), episode(0, 1, [2])])
    group.fresh_from = 1
    first, _ = trained_records([group], TOK, step=3, n=2)
    # The stale first call reads as context (untrained), joined with what is around it.
    assert [s.trained for s in first.segments] == [False, True, False]
    assert first.segments[0].text.count("A") == first.segments[1].text.count("A") == 1


def test_untrained_episodes_read_untrained_and_empty_ones_are_no_row() -> None:
    failed = episode(0, 0, [0, 0], state="env_error")
    cancelled_with_calls = episode(0, 1, [0], state="cancelled")
    never_opened = Trajectory(episode_id="g0-e2", group=0, member=2)
    never_opened.end("cancelled", "group_not_filled")
    reset_failed = Trajectory(episode_id="g0-e3", group=0, member=3, error="reset: 502")
    reset_failed.end("env_error", "env_reset")
    kept = episode(0, 4, [0])
    records = untrained_records(
        [failed, cancelled_with_calls, never_opened, reset_failed, kept], TOK, n=10
    )
    assert [r.episode_id for r in records] == ["g0-e0", "g0-e1", "g0-e3"]
    assert all(r.step == 0 for r in records)
    assert all(not s.trained for r in records for s in r.segments)
    assert any("A" in s.text for s in records[0].segments)  # the model's text, readable
    assert records[0].model_tokens == failed.model_tokens > 0  # still what the model wrote
    assert records[2].info["error"] == "reset: 502"
    assert len(untrained_records([failed, cancelled_with_calls], TOK, n=1)) == 1


def test_episodes_of_dropped_groups_follow_the_failed_ones_untrained() -> None:
    failed = episode(0, 0, [0], state="env_error")
    dropped = [episode(5, m, [0]) for m in range(3)]
    for t in dropped:
        t.info["dropped"] = "equal_rewards"
    records = untrained_records([failed, *dropped], TOK, n=3, dropped=dropped)
    # Kept episodes among the finished ones are not repeated; the dropped ones fill up to n.
    assert [r.episode_id for r in records] == ["g0-e0", "g5-e0", "g5-e1"]
    assert all(r.step == 0 and not any(s.trained for s in r.segments) for r in records)
    assert records[1].info["dropped"] == "equal_rewards"
    assert any("A" in s.text for s in records[1].segments)

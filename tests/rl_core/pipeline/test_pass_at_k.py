"""pass@k's unbiased estimator against direct counts, and the spec's k."""

from __future__ import annotations

import itertools
import math

import pytest

from rl_core.pipeline.pass_at_k import mean_pass_at_k, pass_at_k
from rl_core.spec import SpecError, parse_spec


def counted(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (the first c passing) holding a pass."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_share_of_k_draws_holding_a_pass() -> None:
    assert pass_at_k(10, 3, 5) == pytest.approx(counted(10, 3, 5), abs=1e-15)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    for n, c, k in itertools.product(range(1, 9), range(9), range(1, 9)):
        if c <= n and k <= n:
            assert pass_at_k(n, c, k) == pytest.approx(counted(n, c, k), abs=1e-12)


def test_edge_cases() -> None:
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 0, 1) == 0.0
    # n = k: 1 when any sample passed.
    assert [pass_at_k(4, c, 4) for c in range(5)] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert pass_at_k(8, 3, 1) == 3 / 8  # pass@1 is the share of passing samples
    # Stable at the spec's largest n: no factorial overflow or cancellation to a wrong sign.
    assert pass_at_k(64, 1, 64) == 1.0
    assert pass_at_k(64, 1, 2) == pytest.approx(1 - math.comb(63, 2) / math.comb(64, 2))
    assert 0.0 < pass_at_k(64, 1, 1) < pass_at_k(64, 1, 32) < 1.0
    assert mean_pass_at_k([[True, False], [False, False]], 2) == 0.5
    assert mean_pass_at_k([], 1) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def spec(**train: object) -> object:
    return parse_spec({"environment": {"name": "guess_number"}, "train": train})


def test_the_spec_takes_k_and_refuses_k_greedy_samples() -> None:
    assert spec().train.eval_k == 1  # type: ignore[attr-defined]
    assert spec(eval_k=8, eval_temperature=0.7).train.eval_k == 8  # type: ignore[attr-defined]
    with pytest.raises(SpecError) as info:
        spec(eval_k=4)
    (problem,) = info.value.problems
    assert problem.startswith("train:") and "eval_k" in problem and "eval_temperature" in problem
    for bad in (0, 65):
        with pytest.raises(SpecError) as info:
            spec(eval_k=bad, eval_temperature=1.0)
        assert info.value.problems[0].startswith("train.eval_k:")

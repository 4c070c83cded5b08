"""pass@k: the chance that at least one of k samples of a task passes.

Held-out evaluation draws ``n`` samples of each task (``train.eval_k``; here
``n = k``) and counts the ``c`` that pass. The unbiased estimator of Chen et al.
2021 ("Evaluating Large Language Models Trained on Code", eq. 1) is
``1 - C(n-c, k) / C(n, k)``: one minus the chance that ``k`` samples drawn
without replacement from the ``n`` are all failures. With ``k = 1`` it is
``c / n``, the share of passing samples; with ``n = k`` it is 1 when any
sample passes.

Computed on exact integers (`math.comb`) and divided once: Python's division of
two integers is correctly rounded, so there is no overflow of factorials or
loss of precision for any ``n`` (the spec bounds it to 64 anyway).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of ``c`` passing samples out of ``n`` (``1 <= k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a passing sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(tasks: Iterable[Sequence[bool]], k: int) -> float:
    """The mean over tasks of pass@k, each task given as its samples' pass/fail."""
    values = [pass_at_k(len(samples), sum(samples), k) for samples in tasks]
    return sum(values) / len(values) if values else 0.0


__all__ = ["mean_pass_at_k", "pass_at_k"]

"""Which sandbox wall stands on this host, and whether tenant code may run behind it.

Only bubblewrap's wall (`rl_core.envs.sandbox`) stands between one tenant's program and
the rest of the machine: behind the weaker walls (``unshare -rn``, the audit hook alone) a
program that gets past the hook reads another run's files, starts processes, and leaves a
child running after its time limit (tests/security/test_sandbox_attacks.py runs each
attack against both). So the host says what it accepts:

- `MULTI_TENANT` (a deployed worker): tenant code runs behind bubblewrap or not at all;
  without it, a ``code_exec`` run fails at its first reset with `SandboxRefused`, whose
  message names what is missing and the operator's fix.
- `SINGLE_USER` (``rlaas train``, the embedded quickstart, a notebook: one user running
  their own model's code on their own machine): the strongest wall here, with a warning.
- `operator_accepts_weak_wall` (a deployed worker whose operator set the opt-out): as
  single-user, the warning naming the setting that accepted it.

`assess` is what a host reports (the worker at start-up, on ``/readyz``, in each claim).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from rl_core.envs.sandbox import Isolation, bwrap_problem, namespaces_available

TenantCode = Literal["runs", "runs_on_weak_wall", "refused"]

_WEAK = {
    "namespace": "unshare -rn: a network namespace of its own, nothing more",
    "audit": "the audit hook alone",
}
_GETS_THROUGH = (
    "not a wall between tenants: a program that gets past the audit hook can read the "
    "host's files and other runs', start processes, and leave children running after its "
    "time limit"
)
_FIX = (
    "install Debian's `bubblewrap` package and allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 on Debian; on Ubuntu 24.04 and later "
    "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap; "
    "in a container, seccomp and AppArmor unconfined as docker/compose.yaml sets)"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WallPolicy:
    """What a host accepts. ``weak_wall``: "refuse" (tenant code runs behind bubblewrap
    or not at all) or "warn" (behind the strongest wall here). ``accepted_by``: who
    accepted a weaker wall, for the warning. ``opt_out``: how an operator accepts one,
    for the refusal's message."""

    weak_wall: Literal["refuse", "warn"]
    accepted_by: str = ""
    opt_out: str = ""


SINGLE_USER = WallPolicy(
    weak_wall="warn", accepted_by="a single-user run on its own machine (not a deployed worker)"
)
MULTI_TENANT = WallPolicy(weak_wall="refuse")


def operator_accepts_weak_wall(setting: str) -> WallPolicy:
    """A deployed worker whose operator set ``setting`` to run tenant code without bwrap."""
    return WallPolicy(weak_wall="warn", accepted_by=f"the operator ({setting})")


@dataclasses.dataclass(frozen=True)
class WallReport:
    """The wall that stands here, what happens to tenant code, and a sentence that says
    both (a log line, a run's warning or its failure reason)."""

    wall: Isolation
    tenant_code: TenantCode
    message: str

    @property
    def weak(self) -> bool:
        return self.wall != "bwrap"


def assess(policy: WallPolicy) -> WallReport:
    """The wall a sandboxed program gets on this host under ``policy`` (probes cached)."""
    problem = bwrap_problem()
    if problem is None:
        return WallReport(
            "bwrap",
            "runs",
            "sandbox wall: bubblewrap (each program sees no host file, process or network)",
        )
    wall: Isolation = "namespace" if namespaces_available() else "audit"
    if policy.weak_wall == "refuse":
        opt_out = f", or accept the weaker wall ({_WEAK[wall]}) with {policy.opt_out}"
        return WallReport(
            wall,
            "refused",
            f"sandbox wall: none strong enough, so this worker refuses to run tenant code "
            f"(code_exec): {problem}. The operator's fix: {_FIX}"
            + (opt_out if policy.opt_out else ""),
        )
    return WallReport(
        wall,
        "runs_on_weak_wall",
        f"sandbox wall: WEAK ({_WEAK[wall]}), accepted by {policy.accepted_by}; "
        f"{_GETS_THROUGH}. Why: {problem}. For the strong wall, {_FIX}",
    )


__all__ = [
    "MULTI_TENANT",
    "SINGLE_USER",
    "TenantCode",
    "WallPolicy",
    "WallReport",
    "assess",
    "operator_accepts_weak_wall",
]

"""A tenant's own quotas, set by the operator (``rlaas tenants quota``): the ``tenants.quota_*``
columns that take the deployment's settings' place for that tenant (app.services.quotas).

A quota is set to a number or back to ``default`` (NULL: the setting again). Values are
checked before anything is written, so a command with one bad value changes nothing:

- the Tinker API's limits take 0, which turns the limit off for the tenant, as the
  setting's 0 does for all;
- the others take 1 or more: their 0 would not turn them off but shut the tenant out
  (no runs, no requests, no body), which is what revoking its keys is for;
- none may pass its column (2**31 - 1, or 2**63 - 1 for the byte and token counts).

Running API processes read a change within ``app.services.quotas.CACHE_TTL_S`` (10 s);
the Tinker calls-in-flight and models limits at the next call (read under the tenant's lock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Tenant
from app.errors import NotFound, Unprocessable
from app.services.quotas import Quotas
from app.settings import Settings

INT32 = 2**31 - 1
INT64 = 2**63 - 1
DEFAULT = "default"


@dataclass(frozen=True)
class Override:
    setting: str  # the deployment's default, as the operator sets it
    minimum: int
    maximum: int


# The names are the columns' without ``quota_``, and Quotas' fields.
OVERRIDES: dict[str, Override] = {
    "runs_in_flight": Override("RLAAS_QUOTA_RUNS_IN_FLIGHT", 1, INT32),
    "requests_per_minute": Override("RLAAS_QUOTA_REQUESTS_PER_MINUTE", 1, INT32),
    "body_bytes": Override("RLAAS_QUOTA_BODY_BYTES", 1, INT32),
    "run_seconds": Override("RLAAS_QUOTA_RUN_SECONDS", 1, INT32),
    "train_steps": Override("RLAAS_QUOTA_TRAIN_STEPS", 1, INT32),
    "dataset_bytes": Override("RLAAS_QUOTA_DATASET_BYTES", 1, INT64),
    "artifact_bytes": Override("RLAAS_QUOTA_ARTIFACT_BYTES", 1, INT64),
    "tinker_models_per_base": Override("RLAAS_TINKER_MAX_MODELS_PER_BASE", 0, INT32),
    "tinker_calls_in_flight": Override("RLAAS_TINKER_MAX_CALLS_IN_FLIGHT", 0, INT32),
    "tinker_tokens_per_minute": Override("RLAAS_TINKER_TOKENS_PER_MINUTE", 0, INT64),
}


@dataclass(frozen=True)
class QuotaRow:
    """One quota as it holds for the tenant: its value (None: no limit) and whose it is."""

    name: str
    value: int | None
    own: bool
    setting: str


def parse_assignments(texts: Iterable[str]) -> dict[str, int | None]:
    """``NAME=VALUE`` pairs (VALUE a whole number, or ``default``) as overrides to set;
    ``None`` clears one. Names and values are checked here, nothing is written."""
    changes: dict[str, int | None] = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name:
            raise Unprocessable(
                f"{text!r} is not NAME=VALUE; write e.g. tinker_calls_in_flight=64, or "
                "tinker_calls_in_flight=default to go back to the deployment's setting",
                field="quota",
            )
        _known(name)
        if raw == DEFAULT:
            changes[name] = None
            continue
        try:
            value = int(raw, 10)
        except ValueError:
            raise Unprocessable(_range(name, f"got {raw!r}"), field=name) from None
        changes[name] = value
    check(changes)
    return changes


def check(changes: Mapping[str, int | None]) -> None:
    """Refuse an unknown name or a value out of its quota's range, naming it."""
    for name, value in changes.items():
        rule = _known(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise Unprocessable(_range(name, f"got {value!r}"), field=name)
        if not rule.minimum <= value <= rule.maximum:
            why = f"got {value}"
            if value == 0:
                why += (
                    ": 0 would not turn it off but shut the tenant out (only the Tinker "
                    "limits take 0 as no limit); revoke its keys for that"
                )
            raise Unprocessable(_range(name, why), field=name)


async def find(session: AsyncSession, ref: str, *, lock: bool = False) -> Tenant:
    """The tenant with this id (``ten_...``) or name; ``lock``: its row locked until commit."""
    column = Tenant.id if ref.startswith("ten_") else Tenant.name
    query = select(Tenant).where(column == ref)
    if lock:
        # FOR UPDATE: a run's admission reads the quotas under the same lock (admit_run).
        query = query.with_for_update()
    tenant = await session.scalar(query)
    if tenant is None:
        raise NotFound(
            f"no tenant with the id or name {ref!r} (`rlaas tenants create NAME` makes one)",
            field="tenant",
        )
    return tenant


async def set_quotas(session: AsyncSession, ref: str, changes: Mapping[str, int | None]) -> Tenant:
    """Set (or, with None, clear) the tenant's overrides; flushes, the caller commits."""
    check(changes)
    tenant = await find(session, ref, lock=True)
    for name, value in changes.items():
        setattr(tenant, f"quota_{name}", value)
    await session.flush()
    return tenant


def rows(tenant: Tenant, settings: Settings) -> list[QuotaRow]:
    """Every quota as it holds for the tenant, in OVERRIDES' order."""
    quotas = Quotas.of(tenant, settings)
    out = []
    for name, rule in OVERRIDES.items():
        value: int | None = getattr(quotas, name)
        if name.startswith("tinker_") and value == 0:
            value = None  # 0: no limit
        out.append(QuotaRow(name, value, name in quotas.own, rule.setting))
    return out


def _known(name: str) -> Override:
    rule = OVERRIDES.get(name)
    if rule is None:
        raise Unprocessable(
            f"no quota named {name!r}; the quotas are {', '.join(OVERRIDES)}", field=name
        )
    return rule


def _range(name: str, why: str) -> str:
    rule = OVERRIDES[name]
    low = "0 (no limit)" if rule.minimum == 0 else str(rule.minimum)
    return (
        f"{name} must be a whole number from {low} to {rule.maximum}, or {DEFAULT} (the "
        f"deployment's {rule.setting}); {why}"
    )

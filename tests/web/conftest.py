"""The dashboard against the real control plane: uvicorn on loopback, real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.web.live import LiveApi, live_api, migrated_database


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running

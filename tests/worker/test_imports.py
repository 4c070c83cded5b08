"""Importing the Celery app must not start JAX: producers and `celery inspect` import it."""

from __future__ import annotations

import subprocess
import sys


def test_celery_app_imports_no_jax() -> None:
    code = (
        "import sys, worker.celery_app, worker.tasks; "
        "sys.exit(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules) or 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_cli_help_is_light() -> None:
    code = (
        "import sys; from sdk import cli; "
        "heavy = ('jax', 'fastapi', 'sqlalchemy', 'celery'); "
        "sys.exit(sorted(m for m in heavy if m in sys.modules) or 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr

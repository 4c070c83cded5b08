"""The deployment files: Docker does not run here, so check what can be checked without it.

``docker-compose config`` parses and validates the compose file against the
Compose schema and resolves anchors, without a daemon. The rest reads the
resolved file and the Dockerfiles for the properties the design relies on.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yaml"


def resolved() -> dict[str, Any]:
    # Every service, profiled ones included (docker-compose 1.29's `config` lists them all).
    argv = ["docker-compose", "-f", str(COMPOSE), "config"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def test_compose_file_is_valid_and_has_the_parts() -> None:
    services = resolved()["services"]
    assert set(services) == {"postgres", "redis", "api", "worker-cpu", "worker-gpu"}
    # The GPU worker starts only when asked for (--profile gpu).
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    assert "profiles" not in services["worker-cpu"]


def test_only_the_api_holds_database_credentials() -> None:
    services = resolved()["services"]
    assert "RLAAS_DATABASE_URL" in services["api"]["environment"]
    for name in ("worker-cpu", "worker-gpu"):
        env = services[name]["environment"]
        assert "RLAAS_DATABASE_URL" not in env, name
        assert env["RLAAS_API_URL"] == "http://api:8000"
        assert env["RLAAS_WORKER_TOKEN"] == services["api"]["environment"]["RLAAS_WORKER_TOKEN"]
    # The workers here hold the shared token, so the API on its Postgres must keep it on.
    assert services["api"]["environment"]["RLAAS_ALLOW_SHARED_WORKER_TOKEN"] == "1"


def test_workers_share_artifact_storage_for_resume_after_a_crash() -> None:
    services = resolved()["services"]
    mounts = {name: services[name]["volumes"][0] for name in ("worker-cpu", "worker-gpu")}
    sources = {
        str(m["source"] if isinstance(m, dict) else m.split(":")[0]) for m in mounts.values()
    }
    assert len(sources) == 1
    # The API streams checkpoint downloads from the same volume, and only reads it.
    api = services["api"]
    (mount,) = api["volumes"]
    source = mount["source"] if isinstance(mount, dict) else mount.split(":")[0]
    assert str(source) in sources
    assert (mount.get("read_only") if isinstance(mount, dict) else mount.endswith(":ro")) is True
    target = mount["target"] if isinstance(mount, dict) else mount.split(":")[1]
    assert api["environment"]["RLAAS_ARTIFACTS_PATH"] == f"{target}/artifacts"


def test_dockerfiles_install_the_right_extras_and_build_from_the_repo() -> None:
    extras = set(re.findall(r"^\s*(\w+) = \[", (REPO / "pyproject.toml").read_text(), re.M))
    for name, extra in (("api", "api"), ("worker-cpu", "worker"), ("worker-gpu", "worker")):
        text = (REPO / "docker" / f"{name}.Dockerfile").read_text()
        assert re.search(rf"\.\[{extra}[,\]]", text), name  # the extra, maybe with others
        assert extra in extras, f"pyproject.toml has no [{extra}] extra"
        for folder in re.findall(r"^COPY (\S+) ", text, re.M):
            assert (REPO / folder).exists(), f"{name}.Dockerfile copies missing {folder}"
    api = (REPO / "docker" / "api.Dockerfile").read_text()
    assert "rlaas migrate" in api  # the schema is migrated before the API serves


def test_worker_images_ship_bubblewrap_and_workers_refuse_code_without_it() -> None:
    # A deployed worker without bubblewrap refuses code_exec runs (docs/lifecycle.md, "The
    # sandbox wall"): the images install it and fail their build if `bwrap` does not run.
    for name in ("worker-cpu", "worker-gpu"):
        text = (REPO / "docker" / f"{name}.Dockerfile").read_text()
        assert re.search(r"apt-get install [^\n]*\n?[^\n]*bubblewrap", text), name
        assert "bwrap --version" in text, name
    services = resolved()["services"]
    for name in ("worker-cpu", "worker-gpu"):
        service = services[name]
        env = service["environment"]
        # Deployed (a Redis broker, not the embedded SQLite file), and no opt-out set.
        assert env["RLAAS_BROKER_URL"].startswith("redis://"), name
        assert "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP" not in env, name
        # bubblewrap's user namespaces, which Docker's default profiles refuse.
        assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(service["security_opt"])

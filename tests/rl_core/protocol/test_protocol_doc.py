"""docs/environment-protocol.md is executed: its worked signature example verifies, each
JSON example validates against the model (and schema file) it is marked with, the JSON
Schema files are what the models generate, and its numbers are the code's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from rl_core.protocol import signing
from rl_core.protocol.webhook import BODIES, json_schemas
from rl_core.spec import WebhookCallSpec

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "environment-protocol.md").read_text(encoding="utf-8")
EXAMPLE = re.compile(r"<!-- schema: ([a-z-]+) -->\s*```json\n(.*?)\n```", re.S)


def _worked_example() -> dict[str, str]:
    block = re.search(r"<!-- worked-example\b.*?-->\s*```text\n(.*?)\n```", DOC, re.S)
    assert block, "the worked example block is missing"
    fields = {}
    for line in block.group(1).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    assert set(fields) == {"secret", "timestamp", "body", "header"}, fields
    return fields


def test_the_worked_signature_example_verifies() -> None:
    example = _worked_example()
    name, _, value = example["header"].partition(": ")
    body, ts = example["body"].encode(), int(example["timestamp"])
    assert name == signing.HEADER
    assert signing.sign(example["secret"], body, timestamp=ts) == value
    assert signing.verify(example["secret"], body, value, now=ts) == ts
    # The window the page states is the one enforced.
    assert signing.verify(example["secret"], body, value, now=ts + signing.WINDOW_S) == ts
    with pytest.raises(signing.SignatureError, match="window"):
        signing.verify(example["secret"], body, value, now=ts + signing.WINDOW_S + 1)
    with pytest.raises(signing.SignatureError, match="does not match"):
        signing.verify(example["secret"], body + b" ", value, now=ts)


def test_the_page_states_the_window_the_code_enforces() -> None:
    assert signing.WINDOW_S == 300
    assert "300 seconds (5 minutes)" in DOC


def test_every_json_example_validates_against_its_model_and_every_body_has_one() -> None:
    examples = EXAMPLE.findall(DOC)
    # Every ```json block on the page is marked with the body it shows.
    assert len(examples) == DOC.count("```json"), "a ```json block lacks its <!-- schema: -->"
    assert {name for name, _ in examples} == set(BODIES), "a body has no example (or vice versa)"
    for name, text in examples:
        body = BODIES[name]
        adapter = body if isinstance(body, TypeAdapter) else TypeAdapter(body)
        adapter.validate_python(json.loads(text))  # raises, naming the field, if it drifts


def test_the_schema_files_are_what_the_models_generate() -> None:
    files = {p.stem: json.loads(p.read_text()) for p in (REPO / "docs/schemas").glob("*.json")}
    assert files == json_schemas()
    # The script that regenerates them agrees (it writes nothing with --check).
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "protocol_schemas.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    for name in files:
        assert f"(schemas/{name}.json)" in DOC, f"the page does not link schemas/{name}.json"


def test_every_route_is_documented() -> None:
    for route in ("POST {url}/reset", "POST {url}/step", "POST {url}/close"):
        assert route in DOC
    assert "/v1/env-callbacks/{episode_id}/{step}" in DOC


def test_the_defaults_table_is_the_specs() -> None:
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", DOC, re.M))
    defaults = WebhookCallSpec()
    for name in WebhookCallSpec.model_fields:
        assert name in rows, f"environment.webhook.{name} is not in the page's table"
        value = getattr(defaults, name)
        if value is None:  # timeout_s: the registered one
            assert "registered" in rows[name]
        else:
            assert float(rows[name].strip()) == float(value), name


# One episode id format on every page: the worker's (worker/job.py's prefix, then the
# collector's `g<task>-e<member>`, or the evaluator's `eval<step>-e<i>`).
EPISODE_ID = re.compile(r"^run_[0-9a-f]{32}~a[1-9]\d*-(g\d+-e\d+(-r\d+)?|eval\d+-e\d+(-s\d+)?)$")


def test_every_episode_id_on_the_page_is_in_the_workers_format() -> None:
    ids = re.findall(r'"episode_id": ?"([^"]+)"', DOC)
    assert len(ids) >= 6
    for episode_id in ids:
        assert EPISODE_ID.match(episode_id) or re.fullmatch(r"check~[0-9a-f]{12}", episode_id), (
            episode_id
        )
    # The other pages that spell the format spell it the same way.
    lifecycle = (REPO / "docs" / "lifecycle.md").read_text(encoding="utf-8")
    assert "`<run_id>~a<attempt>-g<task>-e<member>`" in DOC
    assert "<run>~a<attempt>-g<task>-e<member>" in lifecycle or (
        "<run_id>~a<attempt>-g<task>-e<member>" in lifecycle
    )


def test_the_episode_ids_the_pipeline_makes_match_the_pages_format() -> None:
    from rl_core.pipeline.collector import derive_seed

    prefix = "run_5d41402abc4b2a76b9719d911017c592~a1-"
    # The collector and the evaluator name episodes with rl_core.envs.episodes' helpers: what
    # they make is what the page says (a change there that the page does not follow fails).
    from rl_core.envs.episodes import eval_episode_id, train_episode_id

    sources = "".join(
        (REPO / "rl_core" / "pipeline" / name).read_text()
        for name in ("collector.py", "evaluate.py")
    )
    assert "train_episode_id(" in sources and "eval_episode_id(" in sources
    assert train_episode_id(prefix, 0, 0) == prefix + "g0-e0"
    assert train_episode_id(prefix, 12, 3, attempt=1) == prefix + "g12-e3-r1"
    assert eval_episode_id(prefix, 4, 0) == prefix + "eval4-e0"
    assert eval_episode_id(prefix, 4, 3, sample=1) == prefix + "eval4-e3-s1"
    for local in ("g0-e0", "g12-e3-r1", "eval4-e0", "eval4-e3-s1"):
        assert EPISODE_ID.match(prefix + local)
    # The seed's range, as the page states it, is derive_seed's and the model's.
    assert "0 to 2147483647" in DOC
    assert all(0 <= derive_seed(i, "env", i) < 2**31 for i in range(200))
    schemas = json_schemas()
    seed = schemas["reset-request"]["properties"]["seed"]
    assert (seed["minimum"], seed["maximum"]) == (0, 2**31 - 1)
    step = schemas["step-request"]["properties"]["step"]
    assert step["minimum"] == 1  # steps count from 1, as the page says


def test_the_page_names_cli_commands_that_exist() -> None:
    from typer.main import get_command

    from sdk.cli import cli

    env_group = get_command(cli).commands["env"]  # type: ignore[attr-defined]
    named = set(re.findall(r"rlaas env ([a-z]+)", DOC))
    assert {"register", "check", "list", "delete", "serve"} <= named
    assert named <= set(env_group.commands), named - set(env_group.commands)
    # The id is the spec's name as returned: the page never doubles its prefix.
    assert "env_<id>" not in DOC and "env_env_" not in DOC

"""Write the JSON Schemas of the environment webhook protocol to docs/schemas/.

    .venv/bin/python scripts/protocol_schemas.py          # regenerate
    .venv/bin/python scripts/protocol_schemas.py --check  # exit 1 if a file is stale

The schemas come from the pydantic models of ``rl_core.protocol.webhook``;
tests/rl_core/protocol/test_protocol_doc.py fails when the files and the models disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_core.protocol.webhook import json_schemas  # noqa: E402

SCHEMAS = ROOT / "docs" / "schemas"


def render(schema: dict[str, object]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    wanted = {f"{name}.json": render(schema) for name, schema in json_schemas().items()}
    stale = sorted(
        name
        for name, text in wanted.items()
        if not (SCHEMAS / name).exists() or (SCHEMAS / name).read_text(encoding="utf-8") != text
    )
    extra = sorted(p.name for p in SCHEMAS.glob("*.json") if p.name not in wanted)
    if check:
        for name in stale + extra:
            print(f"docs/schemas/{name} disagrees with rl_core.protocol.webhook; run {argv[0]}")
        return 1 if stale or extra else 0
    SCHEMAS.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (SCHEMAS / name).write_text(wanted[name], encoding="utf-8")
    for name in extra:
        (SCHEMAS / name).unlink()
    print(f"{len(stale)} written, {len(extra)} removed, {len(wanted) - len(stale)} unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

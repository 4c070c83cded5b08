"""The repository stands on its own: its files point at no document outside it,
and every relative link in its markdown reaches a file (and heading) that exists.

A clone has no design documents beside it; what the code relies on lives in
ARCHITECTURE.md and docs/.
"""

from __future__ import annotations

import re
import subprocess
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Joined at run time, so that this file does not mention them itself.
OUTSIDE = ("../" + "shared/", "DESIGN" + ".md", "BENCHMARKS" + ".md", "STYLE" + ".md")


def _repo_files() -> list[Path]:
    """Tracked files, and new ones git does not ignore (work about to be committed)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = {REPO / name for name in listed.split("\0") if name}
    return sorted(p for p in files if p.is_file())  # a file deleted but not yet unstaged: gone


FILES = _repo_files()
MARKDOWN = [p for p in FILES if p.suffix == ".md"]


def test_the_docs_this_repo_promises_exist() -> None:
    for name in ("README.md", "ARCHITECTURE.md", "docs/lifecycle.md", "docs/benchmarks.md"):
        assert (REPO / name) in MARKDOWN, f"{name} is missing"


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in FILES:
        data = path.read_bytes()
        if not any(word.encode() in data for word in OUTSIDE):
            continue
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for word in OUTSIDE:
                if word in line:
                    found.append(f"{path.relative_to(REPO)}:{number}: {word}")
    assert not found, (
        "these lines point at documents a clone does not have; point at ARCHITECTURE.md or "
        "docs/ instead:\n" + "\n".join(found)
    )


# --- links ---------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fence = [], ""
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append(line)
    return lines


def _links(text: str) -> list[str]:
    targets = []
    for line in _prose_lines(text):
        line = CODE_SPAN.sub("code", line)
        targets += [angled or bare for angled, bare in INLINE_LINK.findall(line)]
        targets += REFERENCE.findall(line)
    return targets


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    anchors = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in _prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            slug = _slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken(source: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``source``) leads nowhere, or None if it resolves."""
    if SCHEME.match(target) or target.startswith("//"):
        return None  # a URL: not this test's business
    raw_path, _, fragment = target.partition("#")
    path = urllib.parse.unquote(raw_path)
    if not path:
        resolved = source
    elif path.startswith("/"):
        resolved = REPO / path.lstrip("/")
    else:
        resolved = source.parent / path
    resolved = resolved.resolve()
    if not resolved.is_relative_to(REPO):
        return "leaves the repository"
    if not resolved.exists():
        return "no such file"
    anchor = urllib.parse.unquote(fragment).lower()
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        return f"{resolved.relative_to(REPO)} has no heading #{fragment}"
    return None


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    problems = []
    for target in _links(doc.read_text(encoding="utf-8")):
        why = _broken(doc, target)
        if why is not None:
            problems.append(f"({target}): {why}")
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_link_checker_sees_links() -> None:
    text = (
        "See [a](docs/x.md#part), ![img](<a b.png>), [`c`](../c.md).\n"
        "```\n[not](in-code.md)\n```\n"
        "`[nor](a-span.md)` and [u](https://example.com)\n"
        "[ref]: ./r.md\n"
    )
    assert _links(text) == ["docs/x.md#part", "a b.png", "../c.md", "https://example.com", "./r.md"]
    assert _slug("The life of a run") == "the-life-of-a-run"
    assert _slug("Claim, lease, heartbeat") == "claim-lease-heartbeat"
    assert _slug("`rl_core` rooms: [map](x.md)") == "rl_core-rooms-map"
    assert _broken(REPO / "README.md", "https://example.com") is None
    assert _broken(REPO / "README.md", "../outside.md") == "leaves the repository"
    assert _broken(REPO / "README.md", "docs/nothing-here.md") == "no such file"
    assert _broken(REPO / "README.md", "docs/lifecycle.md#staleness") is None
    assert _broken(REPO / "README.md", "docs/lifecycle.md#no-such") is not None

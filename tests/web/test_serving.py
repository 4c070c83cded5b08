"""What the control plane serves for the dashboard: the page, its modules, plotly.js."""

from __future__ import annotations

import gzip
import re

import httpx

from app.api.dashboard import WEB, _plotly_bundle
from tests.web.live import LiveApi


def test_the_page_is_served_with_a_strict_policy(live: LiveApi) -> None:
    page = httpx.get(f"{live.url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    # Only our own scripts, and no eval: an API key lives in this page's storage.
    assert "script-src 'self';" in csp and "unsafe-eval" not in csp
    assert "connect-src 'self'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    # Nothing from another host: every script and sheet the page names is ours.
    for ref in re.findall(r'(?:src|href)="([^"#]+)"', page.text):
        assert ref.startswith(("/static/", "data:")), ref


def test_every_module_the_page_imports_is_served_as_javascript(live: LiveApi) -> None:
    names = {p.name for p in WEB.glob("*.js")}
    imports = re.compile(r'from "\./([^"]+)"')
    imported = {m for p in WEB.glob("*.js") for m in imports.findall(p.read_text())}
    assert imported <= names, f"imports of missing modules: {imported - names}"
    for name in [*sorted(names), "dashboard.css"]:
        r = httpx.get(f"{live.url}/static/{name}")
        assert r.status_code == 200, name
        want = "text/css" if name.endswith(".css") else "javascript"
        assert want in r.headers["content-type"], (name, r.headers["content-type"])


def test_plotly_comes_from_the_installed_package_gzipped_or_not(live: LiveApi) -> None:
    path, _ = _plotly_bundle()
    assert "site-packages" in str(path) or "dist-packages" in str(path), path
    url = f"{live.url}/static/vendor/plotly.min.js"
    with httpx.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as packed:
        assert packed.headers["content-encoding"] == "gzip"
        wire = b"".join(packed.iter_raw())
    assert len(wire) < path.stat().st_size / 2, "sent as is, not gzipped"
    assert gzip.decompress(wire) == path.read_bytes()
    plain = httpx.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert plain.content.startswith(b"/**\n* plotly.js v")


def test_no_file_outside_the_web_folder_is_reachable(live: LiveApi) -> None:
    for path in ("/static/../api/dashboard.py", "/static/%2e%2e/settings.py", "/static/nope.js"):
        assert httpx.get(f"{live.url}{path}").status_code == 404, path

"""The dashboard: ``/`` serves one static page, ``/static/...`` its scripts and styles.

The page is plain HTML and ES modules in ``app/web/`` that call the public API
from the browser with the user's key, so this module renders no data and needs
no session. The chart library is plotly.js, served from the ``plotly`` Python
package's own copy (``plotly/package_data/plotly.min.js``): the control plane
may run on a machine with no way out, so nothing comes from a CDN.
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from app.errors import AppError

WEB = Path(__file__).resolve().parent.parent / "web"
PLOTLY_PATH = "/static/vendor/plotly.min.js"

# The page runs only its own scripts and talks only to this origin. plotly.js sets
# element styles from script, hence 'unsafe-inline' for styles (and only for styles);
# charts export as data: images. No inline script: the key never meets an eval.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

router = APIRouter(include_in_schema=False)


class ChartLibraryMissing(AppError):
    status_code = 503
    code = "chart_library_missing"


@router.get("/")
async def index() -> FileResponse:
    # no-cache: a new deployment's page (and the module URLs it names) is seen at once.
    return FileResponse(
        WEB / "index.html",
        media_type="text/html; charset=utf-8",
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


@router.get(PLOTLY_PATH)
async def plotly_js(request: Request) -> Response:
    path, packed = _plotly_bundle()
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
    # 4.8 MB as it ships, ~1.4 MB gzipped: worth it on a remote dashboard.
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(
            packed,
            media_type="text/javascript",
            headers={**headers, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
        )
    return FileResponse(path, media_type="text/javascript", headers=headers)


@cache
def _plotly_bundle() -> tuple[Path, bytes]:
    """The installed plotly package's plotly.min.js, and its gzip, read once per process.

    Found with ``find_spec`` so plotly's Python side is never imported.
    """
    spec = importlib.util.find_spec("plotly")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path, gzip.compress(path.read_bytes(), compresslevel=6)
    raise ChartLibraryMissing(
        "the dashboard's chart library is not installed; install the control plane with "
        "its extra: pip install 'rlaas[api]' (it brings the plotly package)"
    )


def static_files() -> StaticFiles:
    """The page's own files; mounted at /static after the routes above (they match first)."""
    return StaticFiles(directory=WEB, check_dir=True)

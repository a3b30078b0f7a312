"""Serves the dashboard: the page at `/` and its assets under `/dashboard/`, straight from the package (no build).

The page and its assets hold no cluster data, so they are open even with `--api-key`: the page asks for the key
and sends it with every API call it makes, which the API checks as usual.
"""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
ASSETS_PREFIX = "/dashboard/"
PAGE_PATH = "/"
# The page's scripts come from this node only: a policy the browser enforces, so no asset can reach elsewhere.
_CONTENT_SECURITY_POLICY = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"


def mount_dashboard(app: FastAPI) -> None:
    app.mount(ASSETS_PREFIX.rstrip("/"), StaticFiles(directory=STATIC_DIR), name="dashboard")

    @app.get(PAGE_PATH, include_in_schema=False)
    async def page() -> FileResponse:
        headers = {"Content-Security-Policy": _CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}
        return FileResponse(STATIC_DIR / "index.html", headers=headers)


def is_dashboard_asset(path: str) -> bool:
    """Whether `path` is the page or one of its static files (served without the API key)."""
    return path == PAGE_PATH or path.startswith(ASSETS_PREFIX)

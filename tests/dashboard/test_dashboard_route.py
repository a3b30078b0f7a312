"""The dashboard's page and assets: served from the package by every node's API, open without the API key (they hold
no data; every call the page makes is checked as usual), and confined to the package's static folder."""

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from exo.dashboard.routes import STATIC_DIR
from exo.node import NodeConfig
from tests.api.inprocess_app import scripted_app

API_KEY = "sk-dashboard-test"


@pytest.fixture
def keyed_client() -> Iterator[TestClient]:
    application, _master = scripted_app(NodeConfig(api_key=API_KEY))
    with TestClient(application) as client:
        yield client


def _scripts_and_styles(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/dashboard/[^"]+)"', html)


def test_the_page_and_every_asset_it_names_are_served_without_the_key(keyed_client: TestClient) -> None:
    page = keyed_client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assets = _scripts_and_styles(page.text)
    assert "/dashboard/js/app.js" in assets
    assert "/dashboard/css/dashboard.css" in assets
    for asset in assets:
        assert keyed_client.get(asset).status_code == 200, asset


def test_every_module_the_scripts_import_is_served(keyed_client: TestClient) -> None:
    # ES modules import each other by relative path: a missing file would break the page only in a browser.
    for script in sorted((STATIC_DIR / "js").rglob("*.js")):
        for imported in re.findall(r'from "(\.[^"]+)"', script.read_text()):
            target = (script.parent / imported).resolve()
            url = "/dashboard/" + target.relative_to(STATIC_DIR.resolve()).as_posix()
            assert keyed_client.get(url).status_code == 200, f"{script.name} imports {imported}"


def test_the_api_behind_the_page_still_needs_the_key(keyed_client: TestClient) -> None:
    assert keyed_client.get("/state").status_code == 401
    assert keyed_client.get("/v1/cluster").status_code == 401
    assert keyed_client.get("/state", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


@pytest.mark.parametrize("path", ["/dashboard/../state", "/dashboard/%2e%2e/state", "/dashboard/js/../../routes.py"])
def test_asset_paths_cannot_leave_the_static_folder(keyed_client: TestClient, path: str) -> None:
    # The client may normalise the dots away and ask for the API path itself, which then needs the key.
    response = keyed_client.get(path)
    assert response.status_code in (401, 404)
    assert "nodes" not in response.text


def test_the_page_is_not_in_the_api_schema() -> None:
    application, _master = scripted_app(NodeConfig())
    paths = application.openapi()["paths"]
    assert "/" not in paths
    assert not any(path.startswith("/dashboard") for path in paths)

"""A catalog download from the Models view, in a real headless Chromium against a real node: the default catalog
model's pieces come with exo, so the node assembles and converts them into its empty models directory without the
network, and the page shows each phase's progress as it goes, then the model downloaded. Slow: the conversion takes
one to three minutes on a shared 2-core CPU."""

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from exo.models.catalog import DEFAULT_MODEL_ID
from tests.dashboard.browser import ConsoleWatch, open_page, screenshot, why_no_chromium
from tests.exo_server import ExoServer, running_exo
from tests.machine_skips import machine_skipif

pytestmark = [pytest.mark.slow, machine_skipif(why_no_chromium())]

DOWNLOADED_WITHIN_MS = 600_000
# The phases of a catalog model whose pieces come with exo, in order.
PHASES = ["assembling", "converting", "ready"]

# Every progress the row of DEFAULT_MODEL_ID shows, recorded by the page as it renders it: the text and the bar.
RECORD_PROGRESS_JS = """(modelId) => {
  window.shownProgress = [];
  const catalog = document.querySelector('#view-models');
  new MutationObserver(() => {
    const row = [...catalog.querySelectorAll('table[aria-label="Model catalog"] tbody tr')]
      .find((candidate) => candidate.cells[0].textContent === modelId);
    const item = row && row.querySelector('.download-progress li');
    if (!item) return;
    const bar = item.querySelector('progress');
    const shown = {text: item.textContent.trim(), value: bar ? bar.value : null};
    const last = window.shownProgress.at(-1);
    if (!last || last.text !== shown.text || last.value !== shown.value) window.shownProgress.push(shown);
  }).observe(catalog, {childList: true, subtree: true, characterData: true});
}"""

CONVERTED_A_THIRD_JS = """() => [...document.querySelectorAll('#view-models .download-progress li')]
  .some((item) => item.textContent.includes('converting') && item.querySelector('progress')?.value >= 1 / 3)"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([], tmp_path_factory.mktemp("dashboard-download"), ["--no-model", "--node-name", "solo"]) as up:
        yield up


def test_a_catalog_download_shows_each_phase_growing_then_the_model_downloaded(
    node: ExoServer, browser: Browser
) -> None:
    watch = ConsoleWatch()
    page = open_page(browser, watch, f"{node.base_url}/#models")
    row = page.get_by_role("table", name="Model catalog").locator("tbody tr", has_text=DEFAULT_MODEL_ID)
    button = row.get_by_role("button", name=f"Download {DEFAULT_MODEL_ID}")
    expect(button).to_be_enabled()
    page.evaluate(RECORD_PROGRESS_JS, DEFAULT_MODEL_ID)
    button.click()
    expect(button).to_be_disabled()
    # While it converts, the row shows the phase with its bar, and so does the node's entry under Preparations
    # (read from /state, so every node's page would show it).
    expect(row.locator(".download-progress")).to_contain_text("converting", timeout=DOWNLOADED_WITHIN_MS)
    expect(row.get_by_role("progressbar", name=f"{DEFAULT_MODEL_ID} converting")).to_be_visible()
    preparations = page.locator("#view-models li", has_text=f"solo: {DEFAULT_MODEL_ID}")
    expect(preparations).to_contain_text("converting")
    page.wait_for_function(CONVERTED_A_THIRD_JS, timeout=DOWNLOADED_WITHIN_MS)  # for a picture of it under way
    screenshot(page, "models-download")
    expect(page.get_by_text(f"{DEFAULT_MODEL_ID} is downloaded.")).to_be_visible(timeout=DOWNLOADED_WITHIN_MS)
    expect(row.locator(".badge-ready")).to_have_text("downloaded")
    expect(preparations).to_contain_text(f"{DEFAULT_MODEL_ID} ready")
    assert (node.log_path.parent / "models" / DEFAULT_MODEL_ID / "config.json").is_file()

    # What the row showed: several updates of each phase, in order, each bar only growing to full, then the end.
    shown: list[dict[str, Any]] = page.evaluate("window.shownProgress")
    phases = [_phase(update["text"]) for update in shown]
    assert phases == sorted(phases, key=PHASES.index), phases
    assert phases[-1] == "ready"
    for phase in ("assembling", "converting"):
        values = [update["value"] for update in shown if _phase(update["text"]) == phase]
        assert len(values) >= 2, (phase, shown)
        assert all(earlier <= later for earlier, later in pairwise(values)), (phase, values)
        assert 0 <= values[0] < values[-1] == 1, (phase, values)
    assert (watch.errors, watch.refused) == ([], [])
    assert [url for url in watch.requested if not url.startswith(f"{node.base_url}/")] == []


def _phase(text: str) -> str:
    """`<model id> <phase> <bytes done> of <bytes total>…` → the phase."""
    return text.removeprefix(DEFAULT_MODEL_ID).split()[0]

"""Headless Debian Chromium driven by Playwright for the dashboard's tests (Playwright's own browser downloads
cannot work offline: its launcher is pointed at the system's chromium)."""

import os
import re
import shutil
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Error, Page, Request, sync_playwright

CHROMIUM_ARGUMENTS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_DIR = Path(__file__).resolve().parents[2] / "build" / "screenshots"
LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str | None:
    """Debian's chromium (`EXO_CHROMIUM` names another build), or None when none is installed."""
    configured = os.environ.get("EXO_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def why_no_chromium() -> str | None:
    """Why the browser tests cannot run here (None: a chromium was found)."""
    if chromium_path() is not None:
        return None
    return "the dashboard's browser tests need Debian's chromium (apt-get install chromium; .ci/run installs it)"


@contextmanager
def chromium() -> Generator[Browser]:
    path = chromium_path()
    assert path is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGUMENTS)
        try:
            yield browser
        finally:
            browser.close()


# Chromium notes every HTTP error answer in the console; the page expects some (a refused placement, a call before
# the API key is given), so they are counted apart from script errors.
_REFUSED_CALL = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")


@dataclass
class ConsoleWatch:
    """Script errors and uncaught exceptions of one page, the HTTP statuses of the calls the API refused, and the
    address of every request the page made."""

    errors: list[str] = field(default_factory=list[str])
    refused: list[int] = field(default_factory=list[int])
    requested: list[str] = field(default_factory=list[str])

    def attach(self, page: Page) -> None:
        page.on("console", self._console)
        page.on("pageerror", self._page_error)
        page.on("request", self._request)

    def _request(self, request: Request) -> None:
        self.requested.append(request.url)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        refused = _REFUSED_CALL.match(message.text)
        if refused:
            self.refused.append(int(refused.group(1)))
        else:
            self.errors.append(message.text)

    def _page_error(self, error: Error) -> None:
        self.errors.append(f"uncaught: {error}")


def open_page(browser: Browser, watch: ConsoleWatch, url: str, viewport: dict[str, int] = LAPTOP) -> Page:
    """A new tab (its own browsing context) at `url`, watched by `watch`."""
    page = browser.new_context(viewport={"width": viewport["width"], "height": viewport["height"]}).new_page()
    watch.attach(page)
    page.goto(url)
    return page


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS_DIR / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    return path


# Every visible form control with no accessible name: a <label for>, a wrapping label, aria-label(ledby), or text.
UNLABELLED_CONTROLS_JS = """() => [...document.querySelectorAll('input, select, textarea, button, meter, progress')]
  .filter((control) => control.offsetParent !== null || control.getClientRects().length > 0)
  .filter((control) => {
    const labelled = (control.labels && control.labels.length > 0) || control.getAttribute('aria-label')
      || control.getAttribute('aria-labelledby');
    const text = control.tagName === 'BUTTON' && control.textContent.trim();
    return !(labelled || text);
  })
  .map((control) => control.outerHTML.slice(0, 120))"""

# What has the keyboard focus, described for comparing focus order.
FOCUSED_JS = """() => {
  const element = document.activeElement;
  if (!element || element === document.body) return 'body';
  const label = element.labels && element.labels.length ? element.labels[0].textContent.trim() : '';
  const name = label || element.getAttribute('aria-label') || element.textContent.trim();
  return `${element.tagName.toLowerCase()}:${name}`;
}"""

# Whether the page is wider than the window (a phone would have to scroll sideways).
OVERFLOWS_JS = "() => document.documentElement.scrollWidth > window.innerWidth + 1"

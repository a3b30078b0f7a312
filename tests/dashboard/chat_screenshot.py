"""The picture of the chat in docs/CLUSTER.md: headless Chromium asks a running node's default model for code and
saves the page once the reply, its code block and its speed are shown.

    uv run python -m tests.dashboard.chat_screenshot http://127.0.0.1:52415 docs/images/dashboard-chat-code.png

Not a test (the fixture models write no code): run by hand against a node serving a real model.
"""

import argparse
from pathlib import Path

from playwright.sync_api import expect

from tests.dashboard.browser import ConsoleWatch, chromium, open_page

QUESTION = "Write a short Python function that checks whether a string is a palindrome. Code only, no explanation."
VIEWPORT = {"width": 1280, "height": 900}


def main() -> None:
    parser = argparse.ArgumentParser(description="Take the picture of the chat answering with a code block.")
    parser.add_argument("url", help="the node's address")
    parser.add_argument("output", type=Path, help="where the PNG goes")
    parser.add_argument("--model", help="the model to ask (default: the first the node serves)")
    parser.add_argument("--max-tokens", type=int, default=256, help="the reply's max_tokens")
    arguments = parser.parse_args()
    watch = ConsoleWatch()
    with chromium() as browser:
        page = open_page(browser, watch, f"{arguments.url}/#chat", VIEWPORT)
        model = page.get_by_label("Model", exact=True)
        expect(model.locator("option").first).to_be_attached(timeout=30_000)
        if arguments.model:
            model.select_option(arguments.model)
        page.get_by_text("Settings and tools").click()
        page.get_by_label("max_tokens").fill(str(arguments.max_tokens))
        page.get_by_text("Settings and tools").click()
        page.get_by_label("Message").fill(QUESTION)
        page.get_by_label("Message").press("Enter")
        reply = page.locator(".message-assistant").last
        expect(reply.locator(".footer")).to_contain_text("finish: ", timeout=540_000)
        expect(reply.locator(".code-block")).not_to_have_count(0)
        page.mouse.move(0, 0)
        page.evaluate("window.scrollTo(0, 0)")
        arguments.output.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=arguments.output)
        print(reply.locator(".footer").inner_text())
    assert watch.errors == [], watch.errors


if __name__ == "__main__":
    main()

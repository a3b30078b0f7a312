"""The dashboard's chat in a real headless Chromium against a real node whose prompts take long to read.

The node serves the long-context fixture models one request at a time (`--batch-size 1`), and the long prompt is
sized from a timed first request so its prefill lasts about three keep-alive intervals here
(tests/api/test_long_prefill_streams.py): the first token comes long after the node's first SSE comment, as for
most real prompts on a CPU. Nothing in the page or the node is slowed or mocked for the test.
"""

import json
import re
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from exo.api.answer_stream import KEEP_ALIVE_SECONDS
from tests.api.test_long_prefill_streams import Calibrated, calibrated_node, prompt_text
from tests.dashboard.browser import ConsoleWatch, open_page, screenshot, why_no_chromium
from tests.exo_server import ExoServer
from tests.fixtures.endless_model import MODEL as ENDLESS
from tests.fixtures.endless_model import WIDE_MODEL
from tests.machine_skips import machine_skipif

pytestmark = [pytest.mark.slow, machine_skipif(why_no_chromium())]

# The long prompt's prefill is calibrated to about 3 keep-alive intervals; on a loaded machine it may take twice that.
LONG_REPLY_WITHIN_MS = 240_000
# After Stop (or the tab closing) the node notices the closed connection and the runner drops the prefill within a
# second (prefill.py); the rest is this process polling /state on a loaded machine.
CANCELLED_WITHIN_S = 10
SHORT_REPLY_WITHIN_MS = 60_000
TTFT = re.compile(r"TTFT (\d+(?:\.\d+)?) (ms|s)")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calibrated]:
    with calibrated_node(tmp_path_factory.mktemp("dashboard-chat"), with_wide_model=True) as calibrated:
        yield calibrated


def open_chat(browser: Browser, watch: ConsoleWatch, server: ExoServer, model: str) -> Page:
    page = open_page(browser, watch, f"{server.base_url}/#chat")
    chosen = page.get_by_role("form", name="Chat request").get_by_label("Model", exact=True)
    expect(chosen.locator(f"option[value='{model}']")).to_have_count(1)
    chosen.select_option(model)
    return page


def set_max_tokens(page: Page, tokens: int) -> None:
    page.get_by_text("Settings and tools").click()
    page.get_by_label("max_tokens").fill(str(tokens))
    page.get_by_text("Settings and tools").click()


def ttft_seconds(footer: str) -> float:
    match = TTFT.search(footer)
    assert match, footer
    value = float(match.group(1))
    return value / 1000 if match.group(2) == "ms" else value


def cancelled_tasks(server: ExoServer, model: str) -> set[object]:
    tasks = server.runner(model)["recent_tasks"]
    assert isinstance(tasks, list)
    return {task["task_id"] for task in tasks if task["outcome"] == "cancelled"}  # pyright: ignore[reportUnknownVariableType]


def wait_for_a_new_cancelled_task(server: ExoServer, model: str, known: set[object]) -> float:
    """Seconds until the runner reports a task not in `known` cancelled, with none left running."""
    started = time.monotonic()
    while time.monotonic() - started < CANCELLED_WITHIN_S:
        if cancelled_tasks(server, model) - known and not server.state()["tasks"]:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"the runner never cancelled the request: {server.runner(model)}, {server.state()['tasks']}")


def test_a_first_token_after_more_than_ten_seconds_shows_the_prefill_progress_then_the_reply(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_chat(browser, watch, node.server, WIDE_MODEL)
    set_max_tokens(page, 8)
    page.get_by_label("Message").fill(prompt_text("browser", node.sentences))
    page.get_by_label("Message").press("Enter")
    reply = page.locator(".message-assistant").last
    # While the prompt is read, the node's keep-alive comments are shown as progress, not parsed as JSON.
    progress = reply.get_by_role("progressbar", name="Prompt read")
    expect(progress).to_be_visible(timeout=int((KEEP_ALIVE_SECONDS + 20) * 1000))
    expect(reply.get_by_role("status")).to_contain_text(re.compile(r"Reading the prompt: \d+ of \d+ tokens"))
    total = int(progress.get_attribute("max") or 0)
    assert total > node.sentences * 10  # the whole prompt, as the node counts it
    screenshot(page, "chat-prefill")
    expect(reply.locator(".footer")).to_contain_text("finish: ", timeout=LONG_REPLY_WITHIN_MS)
    footer = reply.locator(".footer").inner_text()
    assert ttft_seconds(footer) > KEEP_ALIVE_SECONDS, footer
    assert f"prompt {total}" in footer, footer
    expect(reply.get_by_role("progressbar")).to_have_count(0)
    expect(page.locator(".transcript .error:not(:empty)")).to_have_count(0)
    page.get_by_text("Raw SSE of the last reply").click()
    raw = page.get_by_label("Raw server-sent events").inner_text()
    assert ": prefill " in raw
    assert raw.rstrip().endswith("data: [DONE]")
    assert (watch.errors, watch.refused) == ([], [])


def test_stop_and_leaving_the_page_cancel_the_request_on_the_node_and_the_next_message_is_answered(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    server = node.server
    page = open_chat(browser, watch, server, ENDLESS)
    set_max_tokens(page, 4)
    long_prompt = prompt_text("stopped", node.sentences)
    message = page.get_by_label("Message")
    message.fill(long_prompt)
    message.press("Enter")
    expect(page.locator(".message-assistant .reply-status")).to_contain_text("Reading the prompt", timeout=60_000)
    known = cancelled_tasks(server, ENDLESS)
    page.get_by_role("button", name="Stop", exact=True).click()
    wait_for_a_new_cancelled_task(server, ENDLESS, known)
    # Nothing was answered: the message is shown as not answered and is back in the box to send again.
    expect(page.locator(".message-user.failed")).to_contain_text("Not answered: stopped")
    back = message.input_value()
    assert len(back) == len(long_prompt.strip())
    assert back == long_prompt.strip()
    # The node is free at once: a short message is answered without waiting behind the abandoned prompt.
    message.fill("Hello!")
    message.press("Enter")
    reply = page.locator(".message-assistant").last
    expect(reply.locator(".footer")).to_contain_text("finish: length", timeout=SHORT_REPLY_WITHIN_MS)
    footer = reply.locator(".footer").inner_text()
    assert ttft_seconds(footer) < KEEP_ALIVE_SECONDS, footer
    # The abandoned turn is not sent again with the next one: the prompt is the short message alone.
    prompt = re.search(r"prompt (\d+)", footer)
    assert prompt, footer
    assert int(prompt.group(1)) < 100, footer
    # Closing the tab while the node reads a long prompt cancels it too.
    message.fill(prompt_text("closed", node.sentences))
    message.press("Enter")
    expect(page.locator(".message-assistant .reply-status").last).to_contain_text("Reading the prompt", timeout=60_000)
    known = cancelled_tasks(server, ENDLESS)
    page.close()
    wait_for_a_new_cancelled_task(server, ENDLESS, known)
    assert (watch.errors, watch.refused) == ([], [])


def test_enter_sends_shift_enter_breaks_the_line_and_the_conversation_survives_a_reload(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_chat(browser, watch, node.server, WIDE_MODEL)
    settings = page.locator("details.chat-settings")
    # The tools and settings are folded away until asked for.
    expect(settings).not_to_have_attribute("open", "")
    expect(page.get_by_label("Tools (JSON list)")).to_be_hidden()
    set_max_tokens(page, 12)
    message = page.get_by_label("Message")
    message.click()
    page.keyboard.type("First line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    expect(message).to_have_value("First line\nsecond line")
    expect(page.locator(".message-user")).to_have_count(0)
    page.keyboard.press("Enter")
    expect(message).to_have_value("")
    expect(page.locator(".message-user .text")).to_have_text("First line\nsecond line")
    reply = page.locator(".message-assistant")
    expect(reply.locator(".footer")).to_contain_text("finish: ", timeout=SHORT_REPLY_WITHIN_MS)
    footer = reply.locator(".footer").inner_text()
    assert re.search(r"TTFT \S+ \S+ · \d+(\.\d)? tok/s · \d+ tokens", footer), footer
    answer = reply.locator(".markdown").inner_text()
    assert answer.strip()
    # A second conversation; both are listed, and both survive a reload as they were.
    page.get_by_role("button", name="New chat").click()
    expect(page.locator(".message-user")).to_have_count(0)
    message.fill("Another question")
    message.press("Enter")
    expect(page.locator(".message-assistant .footer")).to_contain_text("finish: ", timeout=SHORT_REPLY_WITHIN_MS)
    conversations = page.get_by_role("navigation", name="Conversations")
    expect(conversations.locator(".conversation-title")).to_have_text(["Another question", "First line"])
    page.reload()
    expect(conversations.locator(".conversation-title")).to_have_text(["Another question", "First line"])
    expect(page.locator(".message-user .text")).to_have_text("Another question")
    conversations.get_by_role("button", name="First line", exact=True).click()
    expect(page.locator(".message-user .text")).to_have_text("First line\nsecond line")
    expect(page.locator(".message-assistant .markdown")).to_have_text(answer)
    expect(page.locator(".message-assistant .footer")).to_have_text(footer)
    # Deleting one leaves the other.
    conversations.get_by_role("button", name="Delete conversation Another question").click()
    expect(conversations.locator(".conversation-title")).to_have_text(["First line"])
    page.reload()
    expect(conversations.locator(".conversation-title")).to_have_text(["First line"])
    assert (watch.errors, watch.refused) == ([], [])


def test_a_refused_request_is_shown_in_the_conversation_and_the_message_stays(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_chat(browser, watch, node.server, WIDE_MODEL)
    page.get_by_text("Settings and tools").click()
    page.get_by_role("button", name="Insert an example tool").click()
    tools = json.loads(page.get_by_label("Tools (JSON list)").input_value())
    assert [tool["function"]["name"] for tool in tools] == ["get_weather"]
    page.get_by_label("tool_choice").select_option("named")
    page.get_by_label("Function to call").fill("no_such_function")
    message = page.get_by_label("Message")
    message.fill("What is the weather in Paris?")
    message.press("Enter")
    expect(page.locator(".message-user.failed")).to_contain_text("Not answered: 400: ")
    expect(page.get_by_role("alert").filter(has_text="Your message is back in the box")).to_be_visible()
    expect(message).to_have_value("What is the weather in Paris?")
    # A tool list that is not JSON is refused before anything is sent, the message kept.
    page.get_by_label("Tools (JSON list)").fill("[{not json")
    message.press("Enter")
    expect(page.get_by_role("alert").filter(has_text="Tools: ")).to_be_visible()
    expect(message).to_have_value("What is the weather in Paris?")
    assert (watch.errors, watch.refused) == ([], [400])


def test_replies_render_markdown_and_code_blocks_safely(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_chat(browser, watch, node.server, WIDE_MODEL)
    reply = "\n".join(
        [
            "## Sorting",
            "Use **sorted** with a *key*, see [the docs](https://docs.python.org/3/howto/sorting.html).",
            "",
            "```python",
            "words = sorted(words, key=len)  # <b>not bold</b>",
            "```",
            "",
            "- `len` gives the length",
            "- it works on <img src=x onerror=alert(1)> too",
            "",
            "[click](javascript:alert(1))",
            "",
            "| a | b |",
            "|---|--:|",
            "| 1 | 2 |",
        ]
    )
    rendered = page.evaluate(
        """async (text) => {
          const { renderMarkdown } = await import('/dashboard/js/markdown.js');
          const box = document.createElement('div');
          box.className = 'markdown';
          box.append(renderMarkdown(text));
          document.querySelector('.transcript').append(box);
          return {
            heading: box.querySelector('h4')?.textContent,
            strong: box.querySelector('strong')?.textContent,
            emphasis: box.querySelector('em')?.textContent,
            links: [...box.querySelectorAll('a')].map((a) => [a.textContent, a.getAttribute('href'), a.rel]),
            code: box.querySelector('.code-block code')?.textContent,
            language: box.querySelector('.code-block code')?.className,
            inlineCode: [...box.querySelectorAll('li code')].map((code) => code.textContent),
            items: box.querySelectorAll('ul > li').length,
            cells: [...box.querySelectorAll('table td')].map((cell) => [cell.textContent, cell.className]),
            elements: [...box.querySelectorAll('*')].map((element) => element.tagName.toLowerCase()),
            text: box.textContent,
          };
        }""",
        reply,
    )
    assert rendered["heading"] == "Sorting"
    assert (rendered["strong"], rendered["emphasis"]) == ("sorted", "key")
    assert rendered["links"] == [["the docs", "https://docs.python.org/3/howto/sorting.html", "noopener noreferrer"]]
    assert rendered["code"] == "words = sorted(words, key=len)  # <b>not bold</b>"
    assert rendered["language"] == "language-python"
    assert (rendered["inlineCode"], rendered["items"]) == (["len"], 2)
    assert rendered["cells"] == [["1", ""], ["2", "align-right"]]
    # What a reply says in HTML is shown as text: no element but the renderer's own.
    assert not {"img", "b", "script"} & set(rendered["elements"])
    assert "<img src=x onerror=alert(1)>" in rendered["text"]
    assert "[click](javascript:alert(1))" in rendered["text"]
    expect(page.locator(".code-block").get_by_role("button", name="Copy python")).to_be_visible()
    assert (watch.errors, watch.refused) == ([], [])


# How far from its end the transcript may be and still be at its end (follow_end.js's FOLLOW_WITHIN_PX).
FOLLOW_WITHIN_PX = 48
# The transcript's scrollTop and distance from its end at each frame while the reply grows it by `grow` pixels.
FRAMES_WHILE_GROWING_JS = """async (list, [grow, milliseconds]) => {
  const until = list.scrollHeight + grow;
  const deadline = performance.now() + milliseconds;
  const frames = [];
  while (list.scrollHeight < until) {
    if (performance.now() > deadline) throw new Error(`the reply stopped growing: ${JSON.stringify(frames)}`);
    await new Promise((resolve) => requestAnimationFrame(resolve));
    frames.push([list.scrollTop, list.scrollHeight - list.scrollTop - list.clientHeight]);
  }
  return frames;
}"""
# Waits for the transcript's distance from its end to be within [least, most]; says what it was if it never is.
DISTANCE_FROM_END_WITHIN_JS = """async (list, [least, most, milliseconds]) => {
  const deadline = performance.now() + milliseconds;
  const seen = [];
  for (;;) {
    const distance = list.scrollHeight - list.scrollTop - list.clientHeight;
    if (distance >= least && distance <= most) return distance;
    seen.push([list.scrollTop, list.scrollHeight, distance]);
    if (performance.now() > deadline) {
      throw new Error(`[top, height, from end]: ${JSON.stringify(seen.slice(-30))}, page at ${window.scrollY}`);
    }
    await new Promise((resolve) => requestAnimationFrame(resolve));
  }
}"""


def test_the_transcript_follows_a_streaming_reply_unless_scrolled_up_and_stop_keeps_what_came(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_chat(browser, watch, node.server, ENDLESS)
    set_max_tokens(page, 60_000)  # the endless model writes until stopped
    page.get_by_label("Message").fill("Tell me a very long story.")
    page.get_by_label("Message").press("Enter")
    transcript = page.get_by_role("list", name="Conversation")
    reply = page.locator(".message-assistant").last
    # The reply outgrows the transcript while it streams; at every frame the view is at its end.
    page.wait_for_function(
        "() => { const list = document.querySelector('.transcript');"
        " return list.scrollHeight > list.clientHeight + 400; }",
        timeout=SHORT_REPLY_WITHIN_MS,
    )
    expect(reply.locator(".footer")).to_have_text("streaming…")
    following = transcript.evaluate(FRAMES_WHILE_GROWING_JS, [200, SHORT_REPLY_WITHIN_MS])
    assert following, following
    assert max(distance for _, distance in following) < FOLLOW_WITHIN_PX, following
    # The reader scrolls up with the wheel: the view stays where the reader put it while the reply grows.
    transcript.hover()
    page.mouse.wheel(0, -300)
    transcript.evaluate(DISTANCE_FROM_END_WITHIN_JS, [250, 1e9, SHORT_REPLY_WITHIN_MS])
    top = transcript.evaluate("(list) => list.scrollTop")
    stayed = transcript.evaluate(FRAMES_WHILE_GROWING_JS, [200, SHORT_REPLY_WITHIN_MS])
    # (Scroll anchoring may nudge it, keeping what the reader sees in place while the reply is drawn again.)
    assert all(abs(frame_top - top) < FOLLOW_WITHIN_PX for frame_top, _ in stayed), (top, stayed)
    assert stayed[-1][1] > 250 + 200 - FOLLOW_WITHIN_PX, stayed
    # Scrolled back to the end with no wheel or key (as the scrollbar does), it follows again, although the reply
    # may grow before that scroll's event.
    transcript.evaluate("(list) => { list.scrollTop = list.scrollHeight; }")
    following = transcript.evaluate(FRAMES_WHILE_GROWING_JS, [200, SHORT_REPLY_WITHIN_MS])
    assert max(distance for _, distance in following) < FOLLOW_WITHIN_PX, following
    # Stopped mid-reply: what came is kept in the conversation, marked stopped, with its time to first token (the
    # node's token count comes with the end of a stream, which a stopped reply never gets).
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(reply.get_by_role("alert")).to_have_text("Error: stopped")
    expect(reply.locator(".footer")).to_contain_text(re.compile(r"^TTFT \S+ \S+$"))
    expect(page.locator(".message-user.failed")).to_have_count(0)
    kept = reply.locator(".markdown").inner_text()
    assert kept.strip(), kept
    # Kept in the conversation: drawn again from the browser's history after a reload.
    page.reload()
    expect(page.locator(".message-assistant .markdown")).to_have_text(kept, use_inner_text=True)
    expect(page.locator(".message-assistant").get_by_role("alert")).to_have_text("Error: stopped")
    assert (watch.errors, watch.refused) == ([], [])


# Scrolls made in the page itself, against follow_end.js on a list of its own: a draw (`changed`) comes right after
# each growth, as in the chat; the scroll events come a frame after their scrolls, after the growth that follows them.
FOLLOW_RACES_JS = """async () => {
  const { followEnd } = await import('/dashboard/js/views/follow_end.js');
  const list = document.createElement('ol');
  list.style.cssText = 'height: 200px; overflow-y: auto; margin: 0; padding: 0';
  document.body.append(list);
  const follower = followEnd(list);
  const grow = (px) => { const item = document.createElement('li'); item.style.height = `${px}px`; list.append(item); };
  const draw = (px) => { grow(px); follower.changed(); };
  const scrollEvents = () => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const fromEnd = () => list.scrollHeight - list.scrollTop - list.clientHeight;
  grow(1000);
  follower.restart();
  await scrollEvents();
  const seen = {};
  // This code's scroll to the end, then the list grows past it (a reply appended) before that scroll's event.
  draw(20);
  grow(400);
  await scrollEvents();
  draw(20);
  seen.ownScrollOutgrown = fromEnd();
  // The reader scrolls up (as by the scrollbar: no wheel, no key) and a draw comes before that scroll's event.
  list.scrollTop = 100;
  draw(20);
  await scrollEvents();
  draw(20);
  seen.scrolledUpTop = list.scrollTop;
  // The reader scrolls back to the end and a draw grows the list before that scroll's event.
  list.scrollTop = list.scrollHeight;
  draw(400);
  await scrollEvents();
  draw(20);
  seen.backAtEnd = fromEnd();
  // The list shrinks under a following view (its scroll clamped up): it still follows.
  list.lastChild.remove();
  list.lastChild.remove();
  await scrollEvents();
  draw(300);
  seen.afterShrinking = fromEnd();
  list.remove();
  return seen;
}"""


def test_only_the_readers_scroll_up_stops_the_transcript_following(
    node: Calibrated, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_page(browser, watch, f"{node.server.base_url}/#chat")
    seen = page.evaluate(FOLLOW_RACES_JS)
    assert seen == {"ownScrollOutgrown": 0, "scrolledUpTop": 100, "backAtEnd": 0, "afterShrinking": 0}
    assert (watch.errors, watch.refused) == ([], [])

"""The dashboard in a real headless Chromium against a real two-node cluster on 127.0.0.1.

alpha serves tiny-qwen-tools and endless-qwen (the same model, which never ends before max_tokens); beta serves
nothing (`--no-model`). The page is opened on alpha; everything it shows comes from the public API, polled every
second. The tests run in file order: beta is frozen and thawed, then killed last. Screenshots land in
build/screenshots (git-ignored), at laptop and phone widths.
"""

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, Route, expect

from exo.shared.local_backend import local_weights_in_memory
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.dashboard.browser import (
    FOCUSED_JS,
    OVERFLOWS_JS,
    PHONE,
    UNLABELLED_CONTROLS_JS,
    ConsoleWatch,
    open_page,
    screenshot,
    why_no_chromium,
)
from tests.dashboard.client_load import ClientLoad
from tests.exo_server import fixture_model
from tests.fixtures.endless_model import MODEL as ENDLESS
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL
from tests.machine_skips import machine_skipif

pytestmark = [pytest.mark.slow, machine_skipif(why_no_chromium())]

CHAT_MODEL = "tiny-qwen-tools"
DEEP = "tiny-qwen-tools-deep"
PLACED_WITHIN_MS = 240_000
LIVE_WITHIN_MS = 30_000
# A node that thaws rejoins (zenoh reconnects, the node reports in full) well within this.
REJOINED_WITHIN_MS = 60_000
VIEWS = ("cluster", "models", "activity", "chat")
# The finish reason the node records for each stop reason its Messages answer gives.
FINISH_OF_STOP_REASON = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("dashboard"), "dashboard") as running:
        endless = endless_copy(tmp_path_factory.mktemp("models"))
        alpha = running.start("alpha", [fixture_model(CHAT_MODEL), endless])
        beta = running.start("beta", peers=[alpha])
        running.wait_until(alpha, lambda: alpha.get("/v1/cluster")["nodes_healthy"] == 2, "both nodes", 60)
        yield running, alpha, beta


def node_card(page: Page, name: str) -> Locator:
    return page.get_by_role("listitem", name=f"node {name}")


def test_the_cluster_view_lists_both_nodes_with_their_facts(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    _, alpha, beta = cluster
    page = open_page(browser, watch, alpha.base_url)
    alpha_card, beta_card = node_card(page, "alpha"), node_card(page, "beta")
    expect(alpha_card).to_have_attribute("data-status", "healthy")
    expect(beta_card).to_have_attribute("data-status", "healthy")
    expect(alpha_card).to_have_attribute("data-node-id", alpha.node_id)
    expect(beta_card).to_have_attribute("data-node-id", beta.node_id)
    # alpha started first, so it is the master; its runner measured its BLAS when it loaded.
    expect(alpha_card.get_by_role("heading", level=3)).to_contain_text("master")
    expect(beta_card.get_by_role("heading", level=3)).not_to_contain_text("master")
    expect(alpha_card).to_contain_text("GFLOP/s")
    expect(alpha_card).to_contain_text(CHAT_MODEL)
    # How each node holds weights (what placement plans with) and what its runner measured it holds.
    expect(alpha_card).to_contain_text(f"held as {local_weights_in_memory()}")
    expect(beta_card).to_contain_text(f"held as {local_weights_in_memory()}")
    expect(alpha_card.locator(".runners")).to_contain_text(" · weights ")
    # Each runner's memory as its node measured it, and what its prefix cache holds (the runner reports it idle).
    expect(alpha_card.locator(".runners")).to_contain_text(re.compile(r" · resident \d"))
    expect(alpha_card.locator(".runners")).to_contain_text(re.compile(r" · prefix cache \S+ \S+, \S+ \S+ on disk"))
    expect(beta_card).to_contain_text("none (--no-model)")
    expect(page.locator("#links-list")).to_contain_text("beta → alpha (master)")
    expect(page.locator("#cluster-line")).to_contain_text("2 healthy, 0 degraded, 0 down · master alpha")
    screenshot(page, "cluster")
    assert (watch.errors, watch.refused) == ([], [])
    # Every asset and call comes from the node itself: nothing is fetched from elsewhere.
    assert watch.requested
    assert [url for url in watch.requested if not url.startswith(f"{alpha.base_url}/")] == []


def test_every_control_has_a_label_and_the_keyboard_reaches_the_views_in_order(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    _, alpha, _ = cluster
    page = open_page(browser, watch, alpha.base_url)
    expect(node_card(page, "alpha")).to_be_visible()
    for view in VIEWS:
        page.goto(f"{alpha.base_url}/#{view}")
        expect(page.locator(f"#view-{view}")).to_be_visible()
        page.wait_for_timeout(1500)  # a poll has filled the view
        assert page.evaluate(UNLABELLED_CONTROLS_JS) == [], view
    # From the top: the skip link, then the four views in reading order.
    page.goto(f"{alpha.base_url}/#cluster")
    page.locator("body").focus()
    order = []
    for _ in range(5):
        page.keyboard.press("Tab")
        order.append(page.evaluate(FOCUSED_JS))
    assert order == ["a:Skip to content", "a:Cluster", "a:Models", "a:Activity", "a:Chat"]
    page.keyboard.press("Enter")  # on "Chat": the keyboard opens a view
    expect(page.locator("#view-chat")).to_be_visible()
    expect(page.get_by_role("link", name="Chat")).to_have_attribute("aria-current", "page")
    order = []
    for _ in range(7):
        page.keyboard.press("Tab")
        order.append(page.evaluate(FOCUSED_JS))
    assert order == [
        "button:New chat",
        "ol:Conversation",  # scrollable by keyboard
        "textarea:Message",
        "select:Model",
        "button:Send",  # Stop is disabled until a reply streams
        "summary:Settings and tools",  # max_tokens, the system prompt and the tools, folded away
        "summary:Raw SSE of the last reply",
    ]
    assert (watch.errors, watch.refused) == ([], [])


@pytest.mark.parametrize("view", VIEWS)
def test_each_view_fits_a_phone_screen(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch, view: str
) -> None:
    _, alpha, _ = cluster
    page = open_page(browser, watch, f"{alpha.base_url}/#{view}", PHONE)
    expect(page.locator("#cluster-line")).to_contain_text("healthy")
    page.wait_for_timeout(1500)
    assert not page.evaluate(OVERFLOWS_JS), f"the {view} view is wider than a phone's screen"
    screenshot(page, f"phone-{view}")
    assert (watch.errors, watch.refused) == ([], [])


def test_placing_a_model_over_two_nodes_from_the_page_shows_its_ranks(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    _, alpha, _ = cluster
    page = open_page(browser, watch, f"{alpha.base_url}/#models")
    expect(page.get_by_role("table", name="Model catalog")).to_contain_text("qwen2.5-coder-0.5b-instruct")
    # The catalog's memory is for the format this node holds weights in (/v1/catalog's weights_in_memory).
    expect(page.get_by_role("table", name="Model catalog")).to_contain_text(f" as {local_weights_in_memory()}")
    form = page.get_by_role("form", name="Place a model")
    model = form.get_by_label("Model", exact=True)
    nodes = form.get_by_label("Over at least N nodes")
    # More nodes than are up: the refusal is shown in words, and nothing is placed.
    model.fill(str(fixture_model(DEEP)))
    nodes.fill("3")
    form.get_by_role("button", name="Place").click()
    expect(page.get_by_role("alert")).to_contain_text("to be split over 3 nodes but only 2 are up")
    nodes.fill("2")
    form.get_by_role("button", name="Place").click()
    expect(page.locator("#place-result")).to_contain_text(f"Placed {DEEP}", timeout=60_000)
    ranks = page.get_by_role("table", name=f"Ranks of {DEEP}")
    expect(ranks.locator("tbody tr")).to_have_count(2)
    rows = sorted(row.split("\t")[:3] for row in ranks.locator("tbody tr").all_inner_texts())
    # Rank 0 runs the last layers; the two ranks cover the four layers once, on the two nodes.
    assert [(rank, layers) for rank, _node, layers in rows] == [("rank 0", "2–3"), ("rank 1", "0–1")]
    assert {node for _rank, node, _layers in rows} == {"alpha", "beta"}
    expect(ranks.locator(".badge-ready")).to_have_count(2, timeout=PLACED_WITHIN_MS)
    expect(page.get_by_role("article", name="instance")).to_contain_text("ready")
    # The form's split was left at auto, which is pipeline.
    assert form.get_by_label("Split").input_value() == "auto"
    expect(page.get_by_role("article", name="instance")).to_contain_text("2 of at least 2 nodes · pipeline parallel")
    # The cluster view shows each node's rank and its link in the pipeline ring.
    page.get_by_role("link", name="Cluster").click()
    for rank, node, layers in rows:
        expect(node_card(page, node)).to_contain_text(f"{DEEP} ready {rank} of 2 · layers {layers}")
    expect(page.locator("#links-list")).to_contain_text(f"{DEEP} pipeline ring")
    screenshot(page, "cluster-pipeline")
    page.get_by_role("link", name="Models").click()
    screenshot(page, "models")
    assert (watch.errors, watch.refused) == ([], [400])  # the refused placement


def test_the_chat_streams_a_tool_call_as_it_arrives_and_takes_its_result(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    _, alpha, _ = cluster
    page = open_page(browser, watch, f"{alpha.base_url}/#chat")
    chosen = page.get_by_role("form", name="Chat request").get_by_label("Model", exact=True)
    expect(chosen.locator(f"option[value='{CHAT_MODEL}']")).to_have_count(1)
    chosen.select_option(CHAT_MODEL)
    # Every text the arguments view shows, in order, as the deltas are rendered.
    page.evaluate("""() => {
      window.shownArguments = [];
      new MutationObserver((records) => {
        for (const record of records) for (const node of record.addedNodes) {
          if (node.nodeType !== Node.ELEMENT_NODE) continue;
          for (const view of node.querySelectorAll('.tool-arguments')) window.shownArguments.push(view.textContent);
        }
      }).observe(document.querySelector('.transcript'), {childList: true, subtree: true});
    }""")
    # The tools are folded away until asked for; the list is edited as JSON: the one the fixture model was trained
    # with.
    expect(page.get_by_label("Tools (JSON list)")).to_be_hidden()
    page.get_by_text("Settings and tools").click()
    page.get_by_label("Tools (JSON list)").fill(json.dumps([GET_WEATHER_TOOL], indent=2))
    page.get_by_label("Message").fill("What is the weather in Paris?")
    page.get_by_label("Message").press("Enter")
    reply = page.locator(".message-assistant").first
    expect(reply.locator(".footer")).to_contain_text("finish: tool_calls", timeout=60_000)
    expect(reply.locator(".tool-name")).to_have_count(1)
    expect(reply.locator(".tool-name")).to_have_text("get_weather")
    # Once complete, the arguments are laid out as JSON; as they streamed, each text shown was a longer prefix of
    # what the model wrote.
    arguments = reply.locator(".tool-arguments").inner_text()
    assert json.loads(arguments) == {"city": "Paris"}
    assert arguments == json.dumps({"city": "Paris"}, indent=2)
    shown: list[str] = page.evaluate("window.shownArguments")
    assert shown[-1] == arguments
    streamed = [text for text in dict.fromkeys(shown) if text and text != arguments]
    assert len(streamed) > 2, shown
    assert all(streamed[-1].startswith(partial) for partial in streamed)  # filled in as it came
    # The keyboard is taken to the call's result, which, typed in, continues the turn.
    result = page.get_by_label("Result of get_weather")
    expect(result).to_be_focused()
    page.get_by_text("Raw SSE of the last reply").click()
    raw = page.get_by_label("Raw server-sent events").inner_text()
    assert '"tool_calls"' in raw
    assert raw.rstrip().endswith("data: [DONE]")
    result.fill('{"temperature": 21, "sky": "clear"}')
    page.get_by_role("button", name="Send tool results").click()
    second = page.locator(".message-assistant").nth(1)
    expect(second.locator(".footer")).to_contain_text("finish: ", timeout=60_000)
    expect(page.locator(".message-tool")).to_contain_text("clear")
    expect(page.locator(".transcript .error:not(:empty)")).to_have_count(0)
    screenshot(page, "chat")
    assert (watch.errors, watch.refused) == ([], [])
    assert [url for url in watch.requested if not url.startswith(f"{alpha.base_url}/")] == []


# Each client keeps one request for the endless model running (each ends at max_tokens).
STORY = {"model": ENDLESS, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 400}


def test_the_activity_view_shows_requests_in_flight_the_tokens_per_second_and_how_requests_ended(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch, tmp_path: Path
) -> None:
    _, alpha, beta = cluster
    page = open_page(browser, watch, f"{alpha.base_url}/#activity")
    in_flight = page.get_by_role("table", name="Requests in flight")
    with ClientLoad(alpha.base_url, STORY, clients=3, log_path=tmp_path / "clients.log") as load:
        try:
            expect(in_flight).to_contain_text(ENDLESS, timeout=LIVE_WITHIN_MS)
            # Each running task's phase, and how far its prompt was read (all of it, once it generates).
            expect(in_flight.locator(".badge-running").first).to_have_text("decode")
            expect(in_flight.get_by_role("progressbar").first).to_be_visible()
            expect(in_flight).to_contain_text(re.compile(r"prompt\s+(\d+)/\1 tokens"))
            page.wait_for_timeout(8000)  # several requests end: the chart has something to draw
            # The picture shows requests in flight too.
            expect(in_flight).to_contain_text(ENDLESS, timeout=LIVE_WITHIN_MS)
        except AssertionError as error:
            raise AssertionError(f"{error}\nthe clients: {load.report()}") from error
        screenshot(page, "activity")
    assert load.errors() == []
    expect(page.get_by_text("none right now")).to_be_visible(timeout=LIVE_WITHIN_MS)
    served = page.get_by_role("table", name="Per model").locator("tr", has_text=ENDLESS)
    expect(served.locator("td").nth(1)).not_to_have_text("0")
    caption = page.locator(".chart figcaption").inner_text()
    assert float(caption.split()[1]) > 0, caption
    # Each ended request: its dialect, the node that took it (and the one that served it, when another), how it
    # ended, its prompt and cached tokens, time to first token, output tokens, decode speed and error.
    recent = page.get_by_role("table", name="Recent requests")
    endless_row = recent_row(recent, ENDLESS)
    assert endless_row["Dialect"] == "chat.completions"
    assert endless_row["Node"] == "alpha"
    assert (endless_row["Outcome"], endless_row["Output"], endless_row["Error"]) == ("length", "400", "–")
    assert re.fullmatch(r"\d+ tokens, \d+ cached", endless_row["Prompt"]), endless_row
    assert re.fullmatch(r"\d+ ms|\d+\.\d s", endless_row["TTFT"]), endless_row
    assert float(endless_row["Decode tok/s"]) > 0, endless_row
    # beta's API takes a Messages request for alpha's model, and a chat completion alpha refuses as too long.
    messages = {"model": CHAT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello!"}]}
    answered = httpx.post(f"{beta.base_url}/v1/messages", json=messages, timeout=120)
    assert answered.status_code == 200, answered.text
    too_long = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "word " * 6000}]}
    assert httpx.post(f"{beta.base_url}/v1/chat/completions", json=too_long, timeout=120).status_code == 400
    expect(recent).to_contain_text("context_length_exceeded", timeout=LIVE_WITHIN_MS)
    usage = answered.json()["usage"]
    answered_row = recent_row(recent, "messages")
    assert (answered_row["Model"], answered_row["Node"]) == (CHAT_MODEL, "beta → alpha")
    assert answered_row["Outcome"] == FINISH_OF_STOP_REASON[answered.json()["stop_reason"]]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert answered_row["Prompt"] == f"{prompt} tokens, {usage['cache_read_input_tokens']} cached"
    assert answered_row["Output"] == str(usage["output_tokens"])
    refused_row = recent_row(recent, "context_length_exceeded")
    assert (refused_row["Dialect"], refused_row["Node"], refused_row["Outcome"]) == (
        "chat.completions",
        "beta → alpha",
        "failed",
    )
    assert refused_row["Error"].startswith("context_length_exceeded: ")
    assert (refused_row["TTFT"], refused_row["Output"], refused_row["Decode tok/s"]) == ("–", "–", "–")
    screenshot(page, "activity-recent")
    assert (watch.errors, watch.refused) == ([], [])


def recent_row(recent: Locator, text: str) -> dict[str, str]:
    """The newest row of the recent requests table that contains `text`, by column heading."""
    headings = recent.locator("thead th").all_inner_texts()
    cells = recent.locator("tbody tr", has_text=text).first.locator("td").all_inner_texts()
    return dict(zip(headings, (cell.strip() for cell in cells), strict=True))


def test_a_frozen_node_is_shown_down_in_bounded_time_then_healthy_again_when_it_thaws(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    _, alpha, beta = cluster
    page = open_page(browser, watch, alpha.base_url)
    beta_card = node_card(page, "beta")
    expect(beta_card).to_have_attribute("data-status", "healthy")
    page.evaluate("window.notReloaded = true")
    frozen_at = time.monotonic()
    beta.signal_group(signal.SIGSTOP)  # a sleeping machine: no socket closes, only the missed keep-alives tell
    try:
        expect(beta_card).to_have_attribute("data-status", "down", timeout=LIVE_WITHIN_MS)
        shown_down_after = time.monotonic() - frozen_at
        expect(beta_card).to_contain_text("left the cluster")
        expect(page.locator("#cluster-line")).to_contain_text("1 healthy, 0 degraded, 1 down")
        screenshot(page, "cluster-node-frozen")
        # Meanwhile alpha serves the split model alone, which the Models view marks degraded.
        page.get_by_role("link", name="Models").click()
        instances = page.get_by_role("article", name=f"of {DEEP}")
        expect(instances.locator(".badge-degraded")).to_be_visible(timeout=PLACED_WITHIN_MS)
    finally:
        beta.signal_group(signal.SIGCONT)
    thawed_at = time.monotonic()
    page.get_by_role("link", name="Cluster").click()
    expect(beta_card).to_have_attribute("data-status", "healthy", timeout=REJOINED_WITHIN_MS)
    shown_healthy_after = time.monotonic() - thawed_at
    expect(page.locator("#cluster-line")).to_contain_text("2 healthy, 0 degraded, 0 down")
    # The cluster places the model over both nodes again; the page shows its two ranks ready, none degraded.
    page.get_by_role("link", name="Models").click()
    expect(instances).to_have_count(1, timeout=PLACED_WITHIN_MS)
    expect(instances.locator(".badge-degraded")).to_have_count(0, timeout=PLACED_WITHIN_MS)
    expect(instances.locator("tbody tr")).to_have_count(2, timeout=PLACED_WITHIN_MS)
    expect(instances.locator("tbody .badge-ready")).to_have_count(2, timeout=PLACED_WITHIN_MS)
    assert page.evaluate("window.notReloaded") is True
    assert shown_down_after < LIVE_WITHIN_MS / 1000
    assert shown_healthy_after < REJOINED_WITHIN_MS / 1000
    assert (watch.errors, watch.refused) == ([], [])


def test_a_node_that_is_killed_is_shown_down_without_reloading(
    cluster: tuple[LocalCluster, ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    running, alpha, beta = cluster
    page = open_page(browser, watch, alpha.base_url)
    on_beta_watch = ConsoleWatch()
    on_beta = open_page(browser, on_beta_watch, beta.base_url)
    expect(node_card(page, "beta")).to_have_attribute("data-status", "healthy")
    expect(node_card(on_beta, "beta")).to_have_attribute("data-status", "healthy")
    page.evaluate("window.notReloaded = true")
    killed_at = time.monotonic()
    running.crash(beta)
    expect(node_card(page, "beta")).to_have_attribute("data-status", "down", timeout=LIVE_WITHIN_MS)
    shown_after = time.monotonic() - killed_at
    assert page.evaluate("window.notReloaded") is True
    expect(node_card(page, "beta")).to_contain_text("left the cluster")
    expect(node_card(page, "alpha")).to_have_attribute("data-status", "healthy")
    expect(page.locator("#cluster-line")).to_contain_text("1 healthy, 0 degraded, 1 down")
    expect(page.locator("#links-list")).not_to_contain_text("pipeline ring")
    screenshot(page, "cluster-node-down")
    assert shown_after < LIVE_WITHIN_MS / 1000
    # The split model lost a node: the cluster places it again over the node left, and the page says it is degraded
    # and why (between the two, it is listed as waiting to be placed).
    page.get_by_role("link", name="Models").click()
    instance = page.get_by_role("article", name=f"of {DEEP}")
    expect(instance.locator(".badge-degraded")).to_be_visible(timeout=PLACED_WITHIN_MS)
    expect(instance.locator(".reason")).not_to_be_empty()
    expect(instance.get_by_role("table").locator("tbody tr")).to_have_count(1)
    expect(instance.get_by_role("table")).to_contain_text("alpha")
    expect(page.get_by_role("table", name="Served models")).not_to_contain_text("beta")
    screenshot(page, "models-after-node-down")
    assert (watch.errors, watch.refused) == ([], [])
    # A page served by the killed node says that its node stopped answering.
    expect(on_beta.get_by_role("status").filter(has_text="This node is not answering")).to_be_visible()
    assert on_beta_watch.errors
    assert all("net::ERR_" in error for error in on_beta_watch.errors), on_beta_watch.errors


API_KEY = "sk-dashboard-browser-test"


@pytest.fixture(scope="module")
def keyed_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNode]:
    with local_cluster(tmp_path_factory.mktemp("keyed"), "dashboard-keyed") as running:
        node = running.launch("keyed", extra_arguments=["--api-key", API_KEY])
        headers = {"Authorization": f"Bearer {API_KEY}"}
        running.wait_until(
            node,
            lambda: httpx.get(f"{node.base_url}/v1/cluster", headers=headers, timeout=5).json()["nodes_healthy"] == 1,
            "the keyed node to answer",
            120,
        )
        yield node


def test_with_an_api_key_the_page_asks_for_it_keeps_it_for_the_tab_and_works(
    keyed_node: ClusterNode, browser: Browser, watch: ConsoleWatch
) -> None:
    page = open_page(browser, watch, keyed_node.base_url)
    dialog = page.get_by_role("dialog", name="API key")
    expect(dialog).to_be_visible()
    key = dialog.get_by_label("API key")
    expect(key).to_be_focused()
    screenshot(page, "api-key")
    key.fill("not-the-key")
    key.press("Enter")
    expect(dialog.get_by_role("alert")).to_contain_text("That key was refused")
    key.fill(API_KEY)
    dialog.get_by_role("button", name="Use this key").click()
    expect(dialog).to_be_hidden()
    expect(node_card(page, "keyed")).to_have_attribute("data-status", "healthy")
    assert page.evaluate("sessionStorage.getItem('exo.apiKey')") == API_KEY
    assert page.evaluate("localStorage.length") == 0
    # The key can be changed from the header; a wrong one is refused by the next call and asked for again.
    page.get_by_role("button", name="API key").click()
    expect(dialog).to_be_visible()
    key.fill("another-wrong-key")
    key.press("Enter")
    expect(dialog.get_by_role("alert")).to_contain_text("That key was refused")
    key.fill(API_KEY)
    key.press("Enter")
    expect(dialog).to_be_hidden()
    # A reload of the tab keeps the key; another tab (a new browsing context) asks again.
    page.reload()
    expect(node_card(page, "keyed")).to_be_visible()
    expect(dialog).to_be_hidden()
    other = open_page(browser, watch, keyed_node.base_url)
    expect(other.get_by_role("dialog", name="API key")).to_be_visible()
    # No script error; the only refusals are the calls made before the key was given and with the wrong one.
    assert watch.errors == []
    assert watch.refused
    assert set(watch.refused) == {401}


def test_a_node_that_answers_again_by_asking_for_a_key_leaves_no_not_answering_banner(
    keyed_node: ClusterNode, browser: Browser
) -> None:
    """The node is unreachable for the page's first calls (the banner says so), then answers with 401: the key
    dialog opens and the banner behind it is gone (it stayed, saying the node was not answering)."""
    unreachable = {"now": True}
    page = browser.new_context().new_page()

    def api_call(route: Route) -> None:
        # The page's own files load; every call it makes to the API fails while the node is "unreachable".
        if unreachable["now"] and route.request.resource_type in ("fetch", "xhr"):
            route.abort()
        else:
            route.continue_()

    page.route(f"{keyed_node.base_url}/**", api_call)
    page.goto(keyed_node.base_url)
    banner = page.locator("#connection")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("not answering")
    unreachable["now"] = False
    expect(page.get_by_role("dialog", name="API key")).to_be_visible()
    expect(banner).to_be_hidden()


@pytest.fixture(scope="module")
def half_keyed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    """Two nodes both called "vm" (as two machines of one name are): the first with an API key, the second
    without one."""
    with local_cluster(tmp_path_factory.mktemp("half-keyed"), "dashboard-half-keyed") as running:
        keyed = running.launch(
            "keyed", [fixture_model(CHAT_MODEL)], extra_arguments=["--api-key", API_KEY, "--node-name", "vm"]
        )
        unkeyed = running.launch("unkeyed", peers=[keyed], extra_arguments=["--node-name", "vm"])
        headers = {"Authorization": f"Bearer {API_KEY}"}
        running.wait_until(
            unkeyed,
            lambda: (
                httpx.get(f"{unkeyed.base_url}/v1/cluster", headers=headers, timeout=5).json()["nodes_healthy"] == 2
            ),
            "both nodes, seen from the node without a key",
            120,
        )
        yield keyed, unkeyed


def test_a_node_without_a_key_asks_for_its_clusters_key_and_shows_both_nodes_apart(
    half_keyed_cluster: tuple[ClusterNode, ClusterNode], browser: Browser, watch: ConsoleWatch
) -> None:
    keyed, unkeyed = half_keyed_cluster
    page = open_page(browser, watch, unkeyed.base_url)
    dialog = page.get_by_role("dialog", name="API key")
    expect(dialog).to_be_visible()  # the other node's key guards this node's data too
    key = dialog.get_by_label("API key")
    key.fill(API_KEY)
    key.press("Enter")
    expect(dialog).to_be_hidden()
    keyed_name, unkeyed_name = f"vm-{keyed.node_id[:6]}", f"vm-{unkeyed.node_id[:6]}"
    expect(node_card(page, keyed_name)).to_have_attribute("data-node-id", keyed.node_id)
    expect(node_card(page, unkeyed_name)).to_have_attribute("data-node-id", unkeyed.node_id)
    # Which node is master depends on whose session started first (and, on a loaded machine, on which one was
    # heard from in time), not on which was launched first: the page must name the one the cluster elected.
    summary = httpx.get(
        f"{unkeyed.base_url}/v1/cluster", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5
    ).json()
    master_name, follower_name = (
        (keyed_name, unkeyed_name) if summary["master_node_id"] == keyed.node_id else (unkeyed_name, keyed_name)
    )
    expect(node_card(page, master_name).get_by_role("heading", level=3)).to_contain_text("master")
    expect(page.locator("#cluster-line")).to_contain_text(f"master {master_name}")
    expect(page.locator("#links-list")).to_contain_text(f"{follower_name} → {master_name} (master)")
    expect(node_card(page, keyed_name)).to_contain_text("GFLOP/s", timeout=LIVE_WITHIN_MS)  # its model loaded
    screenshot(page, "distinct-names")
    assert watch.errors == []
    assert set(watch.refused) == {401}

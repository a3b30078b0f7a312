"""The Claude Code folders bench: the captured request moved to another folder, and what it reads from the stream."""

import json

from bench.claude_code_folders import (
    CAPTURED_FOLDER,
    FolderRow,
    Report,
    markdown,
    prefill_comment,
    request_in,
    usage_event,
)
from bench.results import SectionRun


def test_a_folder_changes_only_the_working_directory_line_of_the_system_text() -> None:
    here, there = request_in(CAPTURED_FOLDER, "m"), request_in("/srv/other", "m")
    assert here["stream"] is True
    assert here["model"] == "m"
    assert len(here["tools"]) == 24  # Claude Code 2.1.197's whole tool list
    assert json.dumps(here).replace(CAPTURED_FOLDER, "/srv/other") == json.dumps(there)
    system = "".join(block["text"] for block in there["system"])
    assert "Primary working directory: /srv/other\n" in system


def test_the_lookup_is_read_from_a_prefill_keep_alive_and_the_usage_from_message_delta() -> None:
    assert prefill_comment(": prefill 512/17000 tokens (480 cached)") == (17000, 480)
    assert prefill_comment(": keep-alive") is None
    delta = {"type": "message_delta", "usage": {"input_tokens": 20, "cache_read_input_tokens": 980, "output_tokens": 8}}
    assert usage_event(f"data: {json.dumps(delta)}") == (1000, 980)
    assert usage_event('data: {"type": "ping"}') is None
    assert usage_event("event: message_delta") is None


def test_the_report_names_the_run_and_marks_cancelled_lookups() -> None:
    run = SectionRun(exo_commit="abc1234", cpu="2 × CPU", load_average=(1.0, 2.0, 3.0), command="c", finished_utc="now")
    rows = [
        FolderRow(layout="template", folder="/a", phase="cold", prompt_tokens=17000, cached_tokens=0, seconds=600.0),
        FolderRow(layout="template", folder="/b", phase="memory", prompt_tokens=17000, cached_tokens=500, seconds=None),
    ]
    text = markdown(Report(run=run, load_at_start=(4.0, 5.0, 6.0), model="m", rows=rows))
    assert "Commit abc1234" in text
    assert "load average 4.0 / 5.0 / 6.0 at the start, 1.0 / 2.0 / 3.0 at the end" in text
    assert "| template | cold | /a | 17000 | 0 | 600.0 |" in text
    assert "| template | memory | /b | 17000 | 500 | cancelled after the lookup |" in text

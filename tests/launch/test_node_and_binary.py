"""Which node, model and executable a launch picks, and what it says when it cannot."""

import os
from pathlib import Path

import pytest

from exo.launch import claude_code, opencode
from exo.launch.binary import find_client
from exo.launch.node import choose_model, described_model, node_root
from exo.launch.plan import LaunchError
from exo.shared.types.api import ModelCard
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.state import State
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_NODE, scripted_app
from tests.launch.scripted_api import serving

URL = "http://127.0.0.1:52415"


def _card(model: str) -> ModelCard:
    return ModelCard(id=model, created=0, context_length=4096)


@pytest.mark.parametrize(
    "given",
    ["http://127.0.0.1:52415", "http://127.0.0.1:52415/", "http://127.0.0.1:52415/v1", " http://127.0.0.1:52415/v1/ "],
)
def test_the_node_url_is_its_root_whatever_was_pasted(given: str) -> None:
    assert node_root(given) == URL


def test_the_only_served_model_is_chosen_and_a_requested_one_found() -> None:
    assert choose_model([_card("a")], None, URL).id == "a"
    assert choose_model([_card("a"), _card("b")], "b", URL).id == "b"


def test_several_models_and_none_requested_lists_them() -> None:
    with pytest.raises(LaunchError, match=r"serves several models: a, b\. Choose one with --model"):
        choose_model([_card("a"), _card("b")], None, URL)


def test_no_model_served_says_how_to_serve_one() -> None:
    with pytest.raises(LaunchError, match=r"serves no model .* `uv run exo --model ID`"):
        choose_model([], None, URL)
    with pytest.raises(LaunchError, match=r"'m' is not served: .* `uv run exo --model m`"):
        choose_model([], "m", URL)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_path_comes_first_then_the_pinned_install(tmp_path: Path) -> None:
    pinned = _executable(tmp_path / "clients" / "claude-code" / "node_modules" / ".bin" / "claude")
    on_path = _executable(tmp_path / "bin" / "claude")
    environment = {"PATH": str(tmp_path / "bin"), "EXO_CLIENTS_DIR": str(tmp_path / "clients")}

    assert find_client(claude_code.CLIENT, None, environment) == on_path
    assert find_client(claude_code.CLIENT, None, environment | {"PATH": os.devnull}) == pinned


def test_an_explicit_binary_must_be_executable(tmp_path: Path) -> None:
    plain = tmp_path / "opencode"
    plain.write_text("not a program")
    with pytest.raises(LaunchError, match="is not an executable file"):
        find_client(opencode.CLIENT, plain, {"PATH": ""})
    assert find_client(opencode.CLIENT, _executable(tmp_path / "oc"), {"PATH": ""}) == tmp_path / "oc"


def _state_in_preparation(state: State) -> State:
    """`state` with the scripted model being downloaded on its node, no runner serving it yet."""
    preparation = ModelPreparation(
        model_id=SCRIPTED_MODEL,
        phase="downloading",
        done_bytes=200_000_000,
        total_bytes=400_000_000,
        started_at=0,
        updated_at=1,
    )
    node = state.nodes[SCRIPTED_NODE].model_copy(update={"preparations": {SCRIPTED_MODEL: preparation}})
    return state.model_copy(update={"nodes": {SCRIPTED_NODE: node}, "runners": {}})


def _with_runners(state: State, **update: object) -> State:
    runners = {runner_id: runner.model_copy(update=update) for runner_id, runner in state.runners.items()}
    return state.model_copy(update={"runners": runners})


def test_a_launch_waits_while_the_model_is_prepared_then_loaded_and_takes_its_context_length() -> None:
    """`exo launch` right after `exo` starts: the model is listed preparing, then loading before its runner read it,
    then described; the launch says how far it got and configures the client with the context length."""
    app, master = scripted_app()
    served = master.state
    described = served.runners[next(iter(served.runners))].described
    assert described is not None
    stages = [
        _state_in_preparation(served),
        _with_runners(served, status="loading", metadata=None, description=None),
        served,
    ]
    master.state = stages[0]
    said: list[str] = []

    def next_stage(line: str) -> None:
        said.append(line)
        master.state = stages[len(said)]

    with serving(app) as url:
        card = described_model(url, None, None, next_stage, poll_seconds=0.01)
    assert said == [
        f"waiting for {SCRIPTED_MODEL}: downloading 50% of 400.0 MB",
        f"waiting for {SCRIPTED_MODEL}: the node is loading it",
    ]
    assert card.context_length == described.context_length
    assert card.status in ("ready", "running")


def test_a_launch_stops_with_the_reason_of_a_failed_load_or_when_the_wait_runs_out() -> None:
    app, master = scripted_app()
    served = master.state
    with serving(app) as url:
        master.state = _with_runners(served, status="failed", metadata=None, last_error="no ggml library")
        with pytest.raises(LaunchError, match=f"model '{SCRIPTED_MODEL}' cannot be served .*: no ggml library"):
            described_model(url, None, None, lambda _: None)
        master.state = _state_in_preparation(served)
        with pytest.raises(LaunchError, match=r"is still preparing .* after 0 s: run `exo launch` again"):
            described_model(url, None, None, lambda _: None, wait_seconds=0.2, poll_seconds=0.05)

"""Which node, model and executable a launch picks, and what it says when it cannot."""

import os
from pathlib import Path

import pytest

from exo.launch import claude_code, opencode
from exo.launch.binary import find_client
from exo.launch.node import choose_model, node_root
from exo.launch.plan import LaunchError
from exo.shared.types.api import ModelCard

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

"""Cluster flags: endpoints, peer lists, names, and the zenoh config they become."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from exo.cluster.cluster_tls import tls_link_config
from exo.cluster.settings import (
    LEASE_MILLISECONDS,
    MULTICAST_ADDRESS,
    ClusterSettings,
    ClusterSettingsError,
    check_cluster_name,
    default_listen_endpoint,
    normalise_endpoint,
    parse_peer_list,
    zenoh_config,
)
from exo.main import build_parser, config_from_args
from tests.ports import free_port
from tests.shared.state_builders import NODE_A


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("tcp/10.0.0.2:52414", "tcp/10.0.0.2:52414"),
        ("10.0.0.2:52414", "tcp/10.0.0.2:52414"),
        (" studio.local:1 ", "tcp/studio.local:1"),
        ("tcp/[fe80::1]:52414", "tcp/[fe80::1]:52414"),
    ],
)
def test_endpoints_are_normalised_to_tcp(text: str, endpoint: str) -> None:
    assert normalise_endpoint(text) == endpoint


@pytest.mark.parametrize("text", ["", "tcp/host", "quic/host:1", "tcp/host:70000", "tcp/host:0", "tcp/a b:1"])
def test_malformed_endpoints_are_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(ClusterSettingsError, match="tcp/HOST:PORT"):
        normalise_endpoint(text)


def test_exo_peers_takes_commas_or_whitespace() -> None:
    assert parse_peer_list("10.0.0.2:52414, tcp/10.0.0.3:52414\n10.0.0.4:1") == (
        "tcp/10.0.0.2:52414",
        "tcp/10.0.0.3:52414",
        "tcp/10.0.0.4:1",
    )
    assert parse_peer_list("") == ()


@pytest.mark.parametrize("name", ["", "-lab", "a/b", "a*", "x" * 64, "é"])
def test_cluster_names_that_cannot_be_a_key_segment_are_refused(name: str) -> None:
    with pytest.raises(ClusterSettingsError):
        check_cluster_name(name)


def test_the_node_listens_on_loopback_unless_the_api_is_exposed() -> None:
    assert default_listen_endpoint("127.0.0.1") == "tcp/127.0.0.1:52414"
    assert default_listen_endpoint("0.0.0.0") == "tcp/0.0.0.0:52414"


def test_the_zenoh_config_carries_identity_endpoints_scouting_and_lease() -> None:
    settings = ClusterSettings(listen=("tcp/127.0.0.1:5000",), peers=("tcp/10.0.0.2:52414",), discovery=True)
    config = zenoh_config(settings, NODE_A)
    assert json.loads(config.get_json("id")) == NODE_A
    assert json.loads(config.get_json("mode")) == "peer"
    assert json.loads(config.get_json("listen/endpoints")) == ["tcp/127.0.0.1:5000"]
    assert json.loads(config.get_json("connect/endpoints")) == ["tcp/10.0.0.2:52414"]
    assert json.loads(config.get_json("scouting/multicast/enabled")) is True
    assert json.loads(config.get_json("scouting/multicast/address")) == MULTICAST_ADDRESS
    # A loopback node scouts on the loopback interface only, never advertising 127.0.0.1 to the LAN.
    assert json.loads(config.get_json("scouting/multicast/interface")) in ("lo", "lo0")
    assert json.loads(config.get_json("transport/link/tx/lease")) == LEASE_MILLISECONDS < 10_000
    exposed = zenoh_config(ClusterSettings(listen=("tcp/0.0.0.0:52414",), discovery=False), NODE_A)
    assert json.loads(exposed.get_json("scouting/multicast/enabled")) is False
    assert json.loads(exposed.get_json("scouting/multicast/interface")) == "auto"


def test_cli_defaults_join_the_default_cluster_on_loopback_with_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_PEERS", raising=False)
    monkeypatch.delenv("EXO_CLUSTER_KEY", raising=False)
    config = config_from_args(build_parser().parse_args([]))
    assert config.cluster == ClusterSettings()
    assert config.models == (None,)


def test_cli_cluster_flags_and_exo_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXO_PEERS", "10.0.0.9:52414")
    monkeypatch.delenv("EXO_CLUSTER_KEY", raising=False)
    arguments = ["--host", "0.0.0.0", "--peer", "10.0.0.2:52414", "--cluster", "lab", "--no-discovery", "--no-model"]
    config = config_from_args(build_parser().parse_args(arguments))
    assert config.cluster == ClusterSettings(
        name="lab",
        listen=("tcp/0.0.0.0:52414",),
        peers=("tcp/10.0.0.2:52414", "tcp/10.0.0.9:52414"),
        discovery=False,
    )
    assert config.models == ()


def test_cli_refuses_a_model_on_a_no_model_node() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--no-model", "--model", "x"])


def test_only_a_listener_beyond_loopback_is_reachable_from_the_network() -> None:
    assert ClusterSettings(listen=("tcp/0.0.0.0:52414",)).reachable_from_network
    assert ClusterSettings(listen=("tcp/127.0.0.1:1", "tcp/10.0.0.2:52414")).reachable_from_network
    assert not ClusterSettings(listen=("tcp/127.0.0.1:52414", "tcp/[::1]:52414")).reachable_from_network
    assert not ClusterSettings(listen=()).reachable_from_network


KEY = "correct horse battery staple"


def test_a_cluster_key_comes_from_the_flag_or_the_environment_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXO_CLUSTER_KEY", KEY)
    from_environment = config_from_args(build_parser().parse_args([])).cluster
    assert from_environment.key == KEY
    assert KEY not in repr(from_environment)
    flagged = config_from_args(build_parser().parse_args(["--cluster-key", "another key of 16+ chars"])).cluster
    assert flagged.key == "another key of 16+ chars"
    with pytest.raises(ClusterSettingsError, match="at least 16"):
        config_from_args(build_parser().parse_args(["--cluster-key", "short"]))
    monkeypatch.delenv("EXO_CLUSTER_KEY")
    assert config_from_args(build_parser().parse_args([])).cluster.key is None


# Every shape of key that cannot guard a cluster, with what the refusal says. An empty or blank key started an
# open, plain-TCP cluster without a word (main 0b66627).
WRONG_KEYS = {
    "empty": ("", "it is empty"),
    "blank": ("   ", "it is blank"),
    "tab and newline": ("\t\n", "it is blank"),
    "short": ("short", "it is 5 characters"),
    "15 characters": ("x" * 15, "it is 15 characters"),
    "short padded to 16 with blanks": ("  fifteen chars  ", "it is 13 characters"),
    "blanks around a long key": (f" {KEY} ", "starts or ends with blanks"),
    "a control character": (KEY + "\x1b", "control characters"),
}


@pytest.mark.parametrize("case", list(WRONG_KEYS))
def test_a_cluster_key_of_any_wrong_shape_is_refused_from_the_flag_and_the_environment(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    key, reason = WRONG_KEYS[case]
    with pytest.raises(ClusterSettingsError, match=reason):
        config_from_args(build_parser().parse_args(["--cluster-key", key]))
    monkeypatch.setenv("EXO_CLUSTER_KEY", key)
    with pytest.raises(ClusterSettingsError, match=reason):
        config_from_args(build_parser().parse_args([]))


def test_a_node_given_an_empty_cluster_key_refuses_to_start(tmp_path: Path) -> None:
    environment = {**os.environ, "EXO_HOME": str(tmp_path)}
    environment.pop("EXO_CLUSTER_KEY", None)
    # Ports of its own: on code that let the key through, the node would start (and be stopped by the timeout).
    ports = ["--api-port", str(free_port()), "--listen", f"tcp/127.0.0.1:{free_port()}", "--no-discovery"]
    started = subprocess.run(
        [sys.executable, "-m", "exo", "--no-model", *ports, "--cluster-key", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )
    assert started.returncode == 2, started.stderr
    assert "the cluster key must be at least 16 characters long" in started.stderr
    assert "it is empty" in started.stderr


def test_a_keyed_cluster_links_over_mutual_tls_rooted_in_key_and_name() -> None:
    plain = zenoh_config(ClusterSettings(), NODE_A)
    assert json.loads(plain.get_json("listen/endpoints")) == ["tcp/127.0.0.1:52414"]
    assert json.loads(plain.get_json("transport/link/tls"))["enable_mtls"] is None
    keyed = ClusterSettings(name="lab", key=KEY, peers=("tcp/10.0.0.2:52414",))
    config = zenoh_config(keyed, NODE_A)
    assert json.loads(config.get_json("listen/endpoints")) == ["tls/127.0.0.1:52414"]
    assert json.loads(config.get_json("connect/endpoints")) == ["tls/10.0.0.2:52414"]
    assert json.loads(config.get_json("transport/link/protocols")) == ["tls"]
    assert json.loads(config.get_json("transport/link/tls"))["enable_mtls"] is True
    tls = tls_link_config(KEY, "lab")  # what was inserted (zenoh does not show the certificates back)
    assert KEY not in tls.model_dump_json()

    def authority(settings: ClusterSettings) -> x509.Certificate:
        assert settings.key is not None
        pem = base64.b64decode(tls_link_config(settings.key, settings.name).root_ca_certificate_base64)
        return x509.load_pem_x509_certificate(pem)

    own = x509.load_pem_x509_certificate(base64.b64decode(tls.listen_certificate_base64))
    own.verify_directly_issued_by(authority(keyed))  # raises if another authority signed it
    # Another process with the same key and name derives the very same authority; another key or name does not.
    assert authority(ClusterSettings(name="lab", key=KEY)) == authority(keyed)
    assert authority(ClusterSettings(name="lab", key=KEY + "!")) != authority(keyed)
    assert authority(ClusterSettings(name="lab2", key=KEY)) != authority(keyed)

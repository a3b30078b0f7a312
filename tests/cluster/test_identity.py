"""A node keeps its id across restarts, and two running nodes cannot share one home."""

from pathlib import Path

import pytest

from exo.cluster.identity import NodeIdentityError, claim_node_identity, new_node_id


def test_a_new_home_gets_an_id_that_a_restart_finds_again(tmp_path: Path) -> None:
    first = claim_node_identity(tmp_path / "home")
    first.release()
    second = claim_node_identity(tmp_path / "home")
    second.release()
    assert first.node_id == second.node_id
    assert (tmp_path / "home" / "node_id").read_text().strip() == first.node_id


def test_ids_are_random_32_hex_digits_without_a_leading_zero() -> None:
    ids = {new_node_id() for _ in range(200)}
    assert len(ids) == 200
    for node_id in ids:
        assert len(node_id) == 32
        assert int(node_id, 16) >= 16**31
        assert node_id == node_id.lower()


def test_a_second_node_on_the_same_home_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    running = claim_node_identity(tmp_path)
    with pytest.raises(NodeIdentityError, match="another exo node is running with EXO_HOME="):
        claim_node_identity(tmp_path)
    running.release()
    claim_node_identity(tmp_path).release()


def test_a_corrupt_id_file_is_reported_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "node_id").write_text("not-an-id\n")
    with pytest.raises(NodeIdentityError, match="delete it to get a new identity"):
        claim_node_identity(tmp_path)
    assert (tmp_path / "node_id").read_text() == "not-an-id\n"
    # The failed claim let go of the lock.
    (tmp_path / "node_id").unlink()
    claim_node_identity(tmp_path).release()

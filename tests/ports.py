"""Free local ports for tests that start servers (kept free of heavy imports: rank processes import it)."""

from exo.shared.loopback_ports import free_loopback_port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to now, and that no socket bound to port 0 can be given."""
    return free_loopback_port()

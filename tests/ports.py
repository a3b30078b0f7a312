"""Free local ports for tests that start servers (kept free of heavy imports: rank processes import it)."""

from exo.shared.loopback_ports import free_loopback_port as free_port

__all__ = ["free_port"]

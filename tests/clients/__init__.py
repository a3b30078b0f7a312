"""End-to-end tests that drive exo through real third-party clients (coding agents)."""

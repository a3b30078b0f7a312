"""The master: turns commands into tasks, places them on runners and keeps the node state."""

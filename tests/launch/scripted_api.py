"""exo's production API on a real port in a thread, its runner scripted: a node `exo launch` can ask in milliseconds."""

import threading
import time
from collections.abc import Generator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from tests.ports import free_port


@contextmanager
def serving(app: FastAPI) -> Generator[str]:
    """Serve `app` on a free port until the block ends; yields its root URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)

"""Requests kept running against a node by clients in a process of their own, for a test to watch the node serve.

The clients are threads of a child process, not of the test process: there, after a whole suite, a full garbage
collection holds every thread for seconds on a loaded 2-core machine (a heap of 4.4 million objects took 7.8 s at
load 11), and in a full CI run the three client threads once sent nothing for over 5 s with the node idle. Each
client keeps one HTTP connection (building an `httpx.Client` per request loads the CA bundle: 70 ms of CPU, 0.4 s
at load 11) and bounded timeouts. The child writes a line per request sent and answered; closing its stdin stops
it once the requests out are answered.
"""

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

TIMEOUT = httpx.Timeout(120, connect=10)


class ClientLoad:
    def __init__(self, base_url: str, body: dict[str, Any], clients: int, log_path: Path) -> None:
        self._arguments = [sys.executable, "-m", __name__, base_url, json.dumps(body), str(clients)]
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._collecting_since: float | None = None
        self.longest_collection_s = 0.0  # in the test process, while the clients run

    def __enter__(self) -> "ClientLoad":
        gc.callbacks.append(self._on_collection)
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(self._arguments, stdin=subprocess.PIPE, stdout=log, stderr=log)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._on_collection)
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=TIMEOUT.read)
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()

    def _on_collection(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting_since = time.monotonic()
        elif self._collecting_since is not None:
            self.longest_collection_s = max(self.longest_collection_s, time.monotonic() - self._collecting_since)

    def errors(self) -> list[str]:
        return [line for line in self._log_path.read_text().splitlines() if not line.startswith("{")]

    def longest_idle_s(self) -> float:
        """The longest time, once the clients began, that none of them had a request out."""
        out: dict[tuple[int, float], float | None] = {}
        for line in self._log_path.read_text().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                out[(event["client"], event["sent"])] = event["answered"]
        longest, covered_until = 0.0, None
        for (_, sent), answered in sorted(out.items(), key=lambda item: item[0][1]):
            if covered_until is not None and covered_until != float("inf"):
                longest = max(longest, sent - covered_until)
            end = float("inf") if answered is None else answered
            covered_until = end if covered_until is None else max(covered_until, end)
        return longest

    def report(self) -> str:
        """Each client's last requests (sent-answered, seconds since the clients started), the child's other output,
        and this process's longest garbage collection meanwhile."""
        requests: dict[int, dict[float, str]] = {}
        for line in self._log_path.read_text().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                answered = "out" if event["answered"] is None else f"{event['answered']:.1f}"
                requests.setdefault(event["client"], {})[event["sent"]] = f"{event['sent']:.1f}-{answered}"
        lines = [
            f"client {client}: {len(done)} requests: {', '.join(list(done.values())[-8:])}"
            for client, done in sorted(requests.items())
        ]
        lines.append(f"longest time with no request out: {self.longest_idle_s():.2f} s")
        lines += self.errors()
        lines.append(f"longest garbage collection in the test process: {self.longest_collection_s:.2f} s")
        return "\n".join(lines)


# `print` writes the text and its newline in two calls: two threads printing at once gave one line holding two
# events and an empty line that `errors` reported (a full CI run, 1dae1d9). One locked write per event.
_OUTPUT = threading.Lock()


def _log(event: dict[str, Any]) -> None:
    with _OUTPUT:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def _client(index: int, base_url: str, body: dict[str, Any], stop: threading.Event, started: float) -> None:
    with httpx.Client(base_url=base_url, timeout=TIMEOUT) as client:
        while not stop.is_set():
            sent = time.monotonic() - started
            _log({"client": index, "sent": sent, "answered": None})
            client.post("/v1/chat/completions", json=body).raise_for_status()
            answered = time.monotonic() - started
            _log({"client": index, "sent": sent, "answered": answered})


def main() -> None:
    base_url, body, clients = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    stop = threading.Event()
    started = time.monotonic()
    threads = [threading.Thread(target=_client, args=(n, base_url, body, stop, started)) for n in range(clients)]
    for thread in threads:
        thread.start()
    sys.stdin.read()  # until the test closes it
    stop.set()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()

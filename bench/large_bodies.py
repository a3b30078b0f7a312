"""The API process's memory under large request bodies: peak and settled RSS while N clients each send one body of
about `--megabytes` MB at once, against a real node serving a tiny fixture model.

    uv run python -m bench.large_bodies --clients 6 --megabytes 30

Two kinds of body: `refused` (a chat request whose 30 MB content parses and validates, then fails on a last
field, so no runner work) and `served` (a valid request, which the runner refuses as longer than the context).
Peak RSS is the kernel's high-water mark (VmHWM, reset before each round through /proc/PID/clear_refs).
"""

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.exo_server import fixture_model, running_exo

MODEL = "tiny-qwen-tools"


def _status(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) // 1024  # MiB
    return fields


def _body(megabytes: int, kind: str) -> bytes:
    text = "hello world " * (megabytes * 1024 * 1024 // 12)
    request: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    if kind == "refused":
        request["temperature"] = "hot"
    return json.dumps(request).encode()


def round_(base_url: str, pid: int, clients: int, body: bytes) -> dict[str, object]:
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid)["VmRSS"]
    statuses: list[int] = []

    def send() -> None:
        response = httpx.post(
            f"{base_url}/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=600,
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=send) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    peak = _status(pid)["VmHWM"]
    time.sleep(2)
    settled = _status(pid)["VmRSS"]
    return {"before_mib": before, "peak_mib": peak, "settled_mib": settled, "statuses": statuses, "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--megabytes", type=int, default=30)
    parser.add_argument("--kinds", nargs="+", default=["refused", "served"])
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as home, running_exo([fixture_model(MODEL)], Path(home)) as server:
        pid = server.process.pid
        httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4},
            timeout=60,
        )
        for kind in arguments.kinds:
            body = _body(arguments.megabytes, kind)
            result = round_(server.base_url, pid, arguments.clients, body)
            size = round(len(body) / 1e6, 1)
            print(json.dumps({"kind": kind, "body_mb": size, "clients": arguments.clients, **result}), flush=True)


if __name__ == "__main__":
    main()

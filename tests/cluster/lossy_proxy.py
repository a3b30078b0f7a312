"""A small userspace TCP proxy that adds delay and emulated loss to one link of the rig (this kernel has no netem).

It accepts connections in one network namespace and dials its target from another, so a node whose namespace has
no other way out reaches the cluster only through it. Each chunk read from either side is delivered `delay_s` later;
with probability `loss`, later still by `retransmit_s` — what a lost TCP segment costs the stream (the kernel
retransmits it after a timeout): the bytes arrive, late and in order, as they do over a lossy link. With `record`,
it keeps every byte it carried, one recording per connection and direction: what a wiretap on the link would see.
"""

import contextlib
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from tests.cluster.netns_rig import enter_namespace

CHUNK_BYTES = 65536
# Linux's minimum retransmission timeout.
RETRANSMIT_S = 0.2


@dataclass
class LossyProxy:
    listen_namespace: str
    listen_port: int
    target_namespace: str
    target: tuple[str, int]
    delay_s: float
    loss: float
    retransmit_s: float = RETRANSMIT_S
    record: bool = False
    recordings: list[bytearray] = field(default_factory=list[bytearray])
    chunks: int = 0
    lost: int = 0
    _closing: threading.Event = field(default_factory=threading.Event)
    _sockets: list[socket.socket] = field(default_factory=list[socket.socket])

    def start(self) -> None:
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start listening")

    def close(self) -> None:
        self._closing.set()
        for connection in self._sockets:
            with contextlib.suppress(OSError):
                connection.close()

    def _serve(self, ready: threading.Event) -> None:
        enter_namespace(self.listen_namespace)
        listener = socket.create_server(("127.0.0.1", self.listen_port))
        self._sockets.append(listener)
        ready.set()
        while not self._closing.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        enter_namespace(self.target_namespace)
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._sockets += [client, upstream]
        for source, sink in ((client, upstream), (upstream, client)):
            pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            threading.Thread(target=self._read, args=(source, pending), daemon=True).start()
            threading.Thread(target=self._write, args=(sink, pending), daemon=True).start()

    def _read(self, source: socket.socket, pending: "queue.Queue[tuple[float, bytes] | None]") -> None:
        last = 0.0
        recording = bytearray()
        if self.record:
            self.recordings.append(recording)
        while True:
            try:
                data = source.recv(CHUNK_BYTES)
            except OSError:
                data = b""
            if not data:
                pending.put(None)
                return
            self.chunks += 1
            if self.record:
                recording += data
            due = time.monotonic() + self.delay_s
            if random.random() < self.loss:
                self.lost += 1
                due += self.retransmit_s
            last = max(last, due)  # a stream's bytes arrive in order
            pending.put((last, data))

    def _write(self, sink: socket.socket, pending: "queue.Queue[tuple[float, bytes] | None]") -> None:
        while True:
            item = pending.get()
            if item is None:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            due, data = item
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                sink.sendall(data)
            except OSError:
                return

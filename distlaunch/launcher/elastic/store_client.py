"""A node's client of the nodes' store (``store_server``, over ``store_wire``): one call at a time, each with
its deadline. A call not answered in time makes the store silent (``StoreSilent``): the node serving it
hangs, or its host is cut off with the connection open; every later call then fails at once, so the node
ends without another wait. A connection that dropped is made again, once per call: the request goes again
with its number, and the server answers a change it already made without making it twice. A store that
refuses the connection is gone (``StoreGone``): its launcher ended."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid

from distlaunch.contract.hostname import host_port
from distlaunch.errors import HostError
from distlaunch.launcher.elastic import store_wire as wire


class StoreSilent(HostError):
    """The store did not answer a call within its time: the node serving it hangs, or cannot be reached."""

    cause = "its launcher hangs or was stopped, or its host cannot be reached"

    def __init__(self, endpoint: str, seconds: float):
        super().__init__(
            f"the node serving the rendezvous at {endpoint} has not answered for {seconds:g}s",
            f"{self.cause}; check that node",
        )
        self.seconds = seconds


class StoreGone(ConnectionError):
    """The store's connection dropped and no new one could be made: the node serving it is gone."""


class StoreClient(wire.StoreCalls):
    """The store at HOST:PORT, each call answered within ``answer_within`` seconds (a ``wait`` also gets the
    seconds it waits). The launcher and its watcher thread share one client: a lock keeps their calls apart."""

    def __init__(self, host: str, port: int, answer_within: float):
        self.host, self.port, self.answer_within = host, port, answer_within
        self.endpoint = host_port(host, port)
        self.silent_for: float | None = None  # once a call went unanswered: how long it waited
        self._id = uuid.uuid4().hex  # with each request's number: the server knows a request sent again
        self._seq = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def connect(self, timeout: float) -> None:
        """Open the connection (OSError when nothing listens there, or the name does not resolve)."""
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def hello(self, within: float) -> None:
        """Ask the peer whether it is a distlaunch store: WireError when it answers as something else."""
        if self.call("hello", within=within) != wire.STORE:
            raise wire.WireError("a peer that is not a distlaunch rendezvous store of this version")

    def call(self, op: str, within: float | None = None, **args) -> object:
        """One request's result; StoreError when the store refused it, StoreSilent or StoreGone as above."""
        with self._lock:
            if self.silent_for is not None:
                raise StoreSilent(self.endpoint, self.silent_for)
            self._seq += 1
            within = self.answer_within if within is None else within
            request = {"op": op, **args, "client": self._id, "seq": self._seq}
            try:
                reply = self._exchange(request, time.monotonic() + within + args.get("seconds", 0.0))
            except TimeoutError:
                self.close()
                self.silent_for = round(within) or round(within, 1)  # as the user gave it: whole seconds
                raise StoreSilent(self.endpoint, self.silent_for) from None
        if "error" in reply:
            raise wire.StoreError(str(reply["error"]))
        return reply.get("ok")

    def _exchange(self, request: dict, deadline: float) -> dict:
        """Send the request and read its reply, once more on a new connection when the one we had dropped."""
        for _ in range(2):
            try:
                return self._round_trip(request, deadline)
            except (TimeoutError, wire.WireError):
                self.close()
                raise
            except OSError as exc:  # reset, refused, closed: what a dropped connection looks like
                self.close()
                dropped = exc
        raise StoreGone(f"the store at {self.endpoint} is gone: {dropped}")

    def _round_trip(self, request: dict, deadline: float) -> dict:
        if self._sock is None:
            self.connect(wire.seconds_left(deadline))
        wire.send(self._sock, request, deadline)
        reply = wire.receive(self._sock, deadline)
        if reply is None:  # closed between requests (the server's idle timeout, or its end)
            raise ConnectionResetError("the store closed the connection")
        if reply.get("seq") != request["seq"]:
            raise wire.WireError(f"a reply to request {reply.get('seq')!r}, not to {request['seq']}")
        return reply

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

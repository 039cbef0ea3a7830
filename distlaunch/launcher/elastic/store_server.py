"""The nodes' store, served by one node's launcher: a table of JSON values behind one lock, and a thread per
connection that answers requests (the wire: ``store_wire``). It listens only on the address the rendezvous
endpoint names. Every wait is bounded: a connection that sends nothing for ``idle_s`` seconds is closed (its
client connects again on its next call), one that stops in the middle of a message within ``BODY_S``, one
that sends garbage or too much at once; and it serves at most ``MAX_CONNECTIONS`` connections at a time."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import OrderedDict

from distlaunch.launcher.elastic import store_wire as wire

IDLE_S = 60.0  # a connection that sends no request for this long is closed: its client connects again
BODY_S = 10.0  # once a request's length has come, the rest of it must come within this time
SEND_S = 10.0  # a reply the client does not read within this time closes its connection
MAX_CONNECTIONS = 1024  # a node holds one; more is a peer that floods the port
MAX_CLIENTS_KEPT = 4096  # clients whose last change is kept, to answer it again (oldest forgotten first)
ACCEPT_POLL_S = 0.2  # how soon the accepting thread sees the server closed


class Table:
    """The store's keys and values, and what each request does to them. One condition guards them all: a
    ``wait`` sleeps on it until a change. The last change of each client is kept with its reply, so a client
    that sends it again (its connection dropped before the answer came) gets the answer, and no second change."""

    def __init__(self, values: dict | None = None):
        self.values: dict[str, object] = dict(values or {})
        self.changed = threading.Condition()
        self.replies: OrderedDict[str, tuple[int, object]] = OrderedDict()  # client -> (seq, result) of its last change

    def answer(self, request: dict) -> object:
        """The result of a well-formed request (store_wire.bad_request); StoreError when it cannot be done."""
        op = request["op"]
        if op == "hello":
            return wire.STORE
        if op == "wait":
            return self.wait(request["key"], request["seconds"])
        with self.changed:
            if op not in wire.CHANGES:  # get
                return [self.values.get(key) for key in request["keys"]]
            client, seq = request.get("client"), request.get("seq")
            kept = self.replies.get(client) if isinstance(client, str) else None
            if kept is not None and kept[0] == seq:
                return kept[1]
            result = self.change(op, request)
            if isinstance(client, str):
                self.replies[client] = (seq, result)
                self.replies.move_to_end(client)
                if len(self.replies) > MAX_CLIENTS_KEPT:
                    self.replies.popitem(last=False)
            self.changed.notify_all()
            return result

    def change(self, op: str, request: dict) -> object:
        """Apply one change (``set``, ``add``, ``compare_set``); the caller holds the lock."""
        key = request["key"]
        if op == "set":
            self.values[key] = request["value"]
            return None
        if op == "add":
            count = self.values.get(key, 0)
            if not isinstance(count, int) or isinstance(count, bool):
                raise wire.StoreError(f"{key} holds {count!r}, not a count")
            self.values[key] = count + request["by"]
            return self.values[key]
        if self.values.get(key) == request["expected"]:
            self.values[key] = request["desired"]
        return self.values.get(key)

    def wait(self, key: str, seconds: float) -> object:
        """The value of ``key`` once it is set, or StoreError after ``seconds``."""
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout=seconds):
                raise wire.StoreError(f"{key} was not set within {seconds:g}s")
            return self.values[key]


class StoreServer(wire.StoreCalls):
    """The store on one node: ``start`` binds the endpoint and serves it on threads of its own until ``close``.
    This node's own launcher calls it in process (``call``, the client's methods), with the same answers."""

    def __init__(self, listener: socket.socket, table: Table, idle_s: float = IDLE_S):
        self.listener, self.table, self.idle_s = listener, table, idle_s
        self.port = listener.getsockname()[1]
        self._closed = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()  # over _connections
        threading.Thread(target=self._accept, name="rendezvous-store", daemon=True).start()

    @classmethod
    def start(cls, host: str | None, port: int, values: dict | None = None, idle_s: float = IDLE_S) -> StoreServer:
        """Serve ``values`` on HOST:PORT: the first address of this machine the name resolves to (None: every
        address). OSError when none does (EADDRNOTAVAIL), the port is taken (EADDRINUSE), or the name does not
        resolve (gaierror)."""
        error: OSError | None = None
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, addr in found:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart meets TIME_WAIT leftovers
                sock.bind(addr)
                sock.listen(128)
            except OSError as exc:
                sock.close()
                error = error or exc
                continue
            sock.settimeout(ACCEPT_POLL_S)
            return cls(sock, Table(values), idle_s)
        raise error or OSError(f"{host} resolves to no address")

    def call(self, op: str, **args) -> object:
        """A request answered in this process, as a client's would be over the wire: through JSON both ways, so
        the answers are the same values (lists for tuples), and no caller holds an object of the table."""
        request = json.loads(json.dumps({"op": op, **args}))
        problem = wire.bad_request(request)
        if problem:
            raise wire.StoreError(problem)
        return json.loads(json.dumps(self.table.answer(request)))

    def close(self) -> None:
        """Stop serving: no new connection, and every open one closed."""
        self._closed.set()
        with self._lock:
            connections, self._connections = self._connections, set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes its thread from its read
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            with self._lock:
                full = len(self._connections) >= MAX_CONNECTIONS or self._closed.is_set()
                if not full:
                    self._connections.add(conn)
            if full:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="rendezvous-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Answer one connection's requests until it closes, idles, or breaks the protocol."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while not self._closed.is_set():
                try:
                    request = wire.receive(conn, time.monotonic() + self.idle_s, min(BODY_S, self.idle_s))
                except wire.WireError as exc:  # not one of ours: say why, and hang up
                    with contextlib.suppress(OSError, wire.WireError):
                        wire.send(conn, {"seq": None, "error": str(exc)}, time.monotonic() + 1.0)
                    return
                if request is None:
                    return
                reply, deadline = self._reply(request), time.monotonic() + SEND_S
                try:
                    wire.send(conn, reply, deadline)
                except wire.WireError as exc:  # a reply over the size limit (a get of too many large values)
                    wire.send(conn, {"seq": reply["seq"], "error": str(exc)}, deadline)
        except OSError:  # idle (TimeoutError), cut short, reset: the client connects again if it needs to
            return
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _reply(self, request: dict) -> dict:
        seq = request.get("seq")
        problem = wire.bad_request(request)
        if problem:
            return {"seq": seq, "error": problem}
        try:
            return {"seq": seq, "ok": self.table.answer(request)}
        except wire.StoreError as exc:
            return {"seq": seq, "error": str(exc)}

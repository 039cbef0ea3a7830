"""The nodes' store on the wire: each message is a 4-byte big-endian length, then that many bytes of one JSON
object. Both sides read with a deadline and refuse a message over ``MAX_MESSAGE_BYTES`` before reading it, so
a peer that sends garbage, too much, or nothing costs the other side one bounded wait, never its memory.

A request names its operation (``op``) and its arguments; the client adds its id and the request's number
(``client``, ``seq``), which let the server answer a change sent again on a new connection without making it
twice. A reply is ``{"seq": N, "ok": RESULT}`` or ``{"seq": N, "error": TEXT}``.

Operations (``REQUESTS``): ``hello`` (answered with ``STORE``: the peer is a distlaunch store), ``set`` a key,
``get`` keys (null for a key not set), ``wait`` until a key is set (at most ``seconds``), ``add`` to a counter
(a key not set counts 0) and ``compare_set`` (set ``desired`` when the value is ``expected``, null: not set;
answered with the value after).
"""

from __future__ import annotations

import json
import socket
import struct
import time

MAX_MESSAGE_BYTES = 1 << 20  # a job's messages are a few hundred bytes; a heartbeat read of 10,000 nodes ~200 KiB
MAX_KEY_CHARS = 256
MAX_KEYS = 1 << 14  # in one get
MAX_WAIT_S = 7 * 86400.0  # the longest wait a request may ask for
STORE = {"store": "distlaunch rendezvous", "version": 1}  # the hello's answer
_HEADER = struct.Struct(">I")
# operation -> its arguments and their types (object: any JSON value)
REQUESTS = {
    "hello": {},
    "set": {"key": str, "value": object},
    "get": {"keys": list},
    "wait": {"key": str, "seconds": float},
    "add": {"key": str, "by": int},
    "compare_set": {"key": str, "expected": object, "desired": object},
}
_WORDS = {str: "a string", int: "an integer", list: "a list"}
CHANGES = frozenset({"set", "add", "compare_set"})  # the operations a server must not apply twice


class StoreError(Exception):
    """A store call that failed: the server refused it, or its answer broke the wire protocol."""


class WireError(StoreError):
    """A message that is not one of the store's: not JSON, not an object, cut short, or over the size limit."""


def send(sock: socket.socket, message: dict, deadline: float) -> None:
    """Write one message, all of it by the (monotonic) deadline, or raise TimeoutError."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE_BYTES:  # refused before a byte is written: the connection stays usable
        raise WireError(f"a message of {len(body)} bytes, over the limit of {MAX_MESSAGE_BYTES}")
    sock.settimeout(seconds_left(deadline))
    sock.sendall(_HEADER.pack(len(body)) + body)


def receive(sock: socket.socket, deadline: float, body_within: float | None = None) -> dict | None:
    """Read one message by the deadline (TimeoutError if not); None when the peer closed the connection before
    it. ``body_within``: once its length has come, the rest must come within that many seconds."""
    header = _read(sock, _HEADER.size, deadline, closed_ok=True)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"a message of {size} bytes announced, over the limit of {MAX_MESSAGE_BYTES}")
    if body_within is not None:
        deadline = time.monotonic() + body_within
    try:
        message = json.loads(_read(sock, size, deadline))
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
        raise WireError("a message that is not JSON") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message


def bad_request(request: dict) -> str | None:
    """What is wrong with a request, in words; None for a well-formed one."""
    op = request.get("op")
    fields = REQUESTS.get(op) if isinstance(op, str) else None
    if fields is None:
        return f"no operation {op!r}"
    for name, kind in fields.items():
        if name not in request:
            return f"{name} is missing"
        value = request[name]
        if kind is float and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_WAIT_S
        ):
            return f"{name} must be a number of seconds from 0 to {MAX_WAIT_S:g}"
        if kind is float or kind is object:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{name} must be {_WORDS[kind]}"
    keys = [request["key"]] if "key" in fields else request["keys"] if "keys" in fields else []  # the op's own
    if len(keys) > MAX_KEYS or not all(isinstance(key, str) and len(key) <= MAX_KEY_CHARS for key in keys):
        return f"keys are at most {MAX_KEYS} strings of at most {MAX_KEY_CHARS} characters"
    return None


def _read(sock: socket.socket, size: int, deadline: float, closed_ok: bool = False) -> bytes | None:
    """Exactly ``size`` bytes by the deadline. A peer that closes first: None before the first byte (when
    ``closed_ok``), else ConnectionResetError."""
    data = bytearray()
    while len(data) < size:
        sock.settimeout(seconds_left(deadline))
        chunk = sock.recv(min(size - len(data), 1 << 16))
        if not chunk:
            if closed_ok and not data:
                return None
            raise ConnectionResetError("the peer closed the connection in the middle of a message")
        data += chunk
    return bytes(data)


def seconds_left(deadline: float) -> float:
    """Seconds to the (monotonic) deadline, for a socket's timeout; past it, TimeoutError (0 would not wait)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class StoreCalls:
    """The store's operations as methods, on the client and on the server alike (each defines ``call``)."""

    def call(self, op: str, **args) -> object:
        raise NotImplementedError

    def set(self, key: str, value: object) -> None:
        self.call("set", key=key, value=value)

    def get(self, key: str) -> object:
        """The value of ``key``; None when it is not set."""
        return self.call("get", keys=[key])[0]

    def get_many(self, keys: list[str]) -> list:
        """The values of ``keys``, in one call; None for a key not set."""
        return self.call("get", keys=keys)

    def wait(self, key: str, seconds: float) -> object:
        """The value of ``key`` once it is set; StoreError when it is not within ``seconds``."""
        return self.call("wait", key=key, seconds=seconds)

    def add(self, key: str, by: int) -> int:
        """Add ``by`` to the count at ``key`` (0 when not set): the count after, of every node's adds."""
        return self.call("add", key=key, by=by)

    def compare_set(self, key: str, expected: object, desired: object) -> object:
        """Set ``desired`` when ``key`` holds ``expected`` (None: not set); the value after, either way."""
        return self.call("compare_set", key=key, expected=expected, desired=desired)

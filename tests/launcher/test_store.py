"""The nodes' store on real sockets: a server, its clients, and peers that break the protocol (garbage, a
message over the size limit, one cut short, one that never answers)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distlaunch.contract.endpoint import free_port
from distlaunch.errors import HostError
from distlaunch.launcher.elastic.rendezvous import NodeStore
from distlaunch.launcher.elastic.store_client import StoreClient, StoreGone, StoreSilent
from distlaunch.launcher.elastic.store_server import StoreServer, Table
from distlaunch.launcher.elastic.store_wire import (
    MAX_MESSAGE_BYTES,
    REQUESTS,
    StoreError,
    WireError,
    bad_request,
    receive,
    send,
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["op", "key", "keys", "value", "seconds", "by", "expected", "desired", "client", "seq"]


@pytest.fixture
def server():
    store = StoreServer.start("127.0.0.1", free_port(), {"shape": {"-n": 2}}, idle_s=1.0)
    yield store
    store.close()


def client_of(server: StoreServer, answer_within: float = 5.0) -> StoreClient:
    client = StoreClient("127.0.0.1", server.port, answer_within)
    client.connect(5.0)
    return client


def raw(port: int) -> socket.socket:
    """A plain connection to the port: a peer that speaks whatever the test writes."""
    return socket.create_connection(("127.0.0.1", port), timeout=5.0)


def closed_by_peer(sock: socket.socket, within: float = 5.0) -> bool:
    """Whether the other end closes the connection within the time (what it sent first is skipped)."""
    sock.settimeout(within)
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(1 << 16):
            pass
    return True


@contextlib.contextmanager
def listener(answer=None):
    """A port that accepts connections and answers each with ``answer`` (bytes), or never (None)."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = sock.accept()
                held.append(conn)
                if answer is not None:
                    conn.sendall(answer)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
        for conn in held:
            conn.close()


def test_a_client_sets_gets_counts_and_compares_on_a_real_server(server):
    client = client_of(server)
    assert client.get("shape") == {"-n": 2}  # the server's own values, there before anyone connects
    client.set("job", ["job-1", "10.0.0.1", 29500])
    assert client.get_many(["job", "none"]) == [["job-1", "10.0.0.1", 29500], None]
    assert [client.add("arrived", 1), client.add("arrived", 1), client.add("arrived", 0)] == [1, 2, 2]
    assert server.add("arrived", 1) == 3  # the serving node's own calls, in process, see the same table
    assert client.compare_set("failed", None, {"at": 2.0}) == {"at": 2.0}
    assert client.compare_set("failed", None, {"at": 1.0}) == {"at": 2.0}  # not what it expected: kept
    assert client.compare_set("failed", {"at": 2.0}, {"at": 1.0}) == {"at": 1.0}
    with pytest.raises(StoreError, match="shape holds"):
        client.add("shape", 1)
    client.close()


def test_a_wait_blocks_until_another_client_sets_the_key_or_its_time_is_up(server):
    waiting, setting = client_of(server), client_of(server)
    threading.Timer(0.3, setting.set, args=("job", "ready")).start()
    started = time.monotonic()
    assert waiting.wait("job", 10.0) == "ready"
    assert 0.2 < time.monotonic() - started < 5.0
    with pytest.raises(StoreError, match=r"late was not set within 0\.3s"):
        waiting.wait("late", 0.3)


def test_a_peer_that_sends_garbage_is_told_and_hung_up_on_and_the_others_are_still_served(server):
    client = client_of(server)
    peer = raw(server.port)
    peer.sendall(struct.pack(">I", 8) + b"not json")
    assert receive(peer, time.monotonic() + 5.0) == {"seq": None, "error": "a message that is not JSON"}
    assert closed_by_peer(peer)
    http = raw(server.port)  # another protocol's bytes: "GET " read as a length, far over the limit
    http.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "over the limit" in receive(http, time.monotonic() + 5.0)["error"]
    assert closed_by_peer(http)
    bad = raw(server.port)  # JSON, but no request of ours: refused, and the connection stays
    send(bad, {"op": "drop_table", "seq": 1}, time.monotonic() + 5.0)
    assert receive(bad, time.monotonic() + 5.0) == {"seq": 1, "error": "no operation 'drop_table'"}
    send(bad, {"op": "add", "key": "k", "by": "1", "seq": 2}, time.monotonic() + 5.0)
    assert receive(bad, time.monotonic() + 5.0) == {"seq": 2, "error": "by must be an integer"}
    send(bad, {"op": ["add"], "seq": 3}, time.monotonic() + 5.0)
    assert receive(bad, time.monotonic() + 5.0) == {"seq": 3, "error": "no operation ['add']"}
    deep = raw(server.port)  # valid JSON, nested too deep for the parser
    body = b"[" * 100_000 + b"]" * 100_000
    deep.sendall(struct.pack(">I", len(body)) + body)
    assert receive(deep, time.monotonic() + 5.0) == {"seq": None, "error": "a message that is not JSON"}
    assert client.add("arrived", 1) == 1
    for sock in (peer, http, bad, deep):
        sock.close()


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=4), JSON), st.sampled_from(sorted(REQUESTS)))
@example({"keys": None}, "hello")  # a field another op has, on an op without it
def test_any_json_request_is_answered_or_refused_in_words_never_raised_on(request, op):
    """Whatever object a peer sends, the server checks it and answers it, or says what is wrong: no request
    makes a connection's thread raise anything else (a traceback in the serving launcher's output)."""
    request = {"op": op, **request} if "op" not in request else request
    problem = bad_request(request)
    assert problem is None or isinstance(problem, str)
    if problem is None:
        request = {**request, "seconds": 0} if request["op"] == "wait" else request
        table = Table({"k": 1})
        with contextlib.suppress(StoreError):
            table.answer(request)


def test_a_message_over_the_size_limit_is_refused_before_it_is_read(server):
    peer = raw(server.port)
    peer.sendall(struct.pack(">I", MAX_MESSAGE_BYTES + 1) + b"x" * 1000)  # the rest never needs to come
    assert "over the limit" in receive(peer, time.monotonic() + 5.0)["error"]
    assert closed_by_peer(peer)
    client = client_of(server)
    with pytest.raises(WireError, match="over the limit"):  # the client refuses to send one at all
        client.set("big", "x" * MAX_MESSAGE_BYTES)
    assert client.add("arrived", 1) == 1  # and its connection still works
    peer.close()


def test_a_peer_that_stops_in_the_middle_of_a_message_is_closed_and_holds_nobody(server):
    peer = raw(server.port)
    peer.sendall(struct.pack(">I", 100) + b'{"op": "se')  # and nothing more
    client = client_of(server)
    assert client.add("arrived", 1) == 1  # served meanwhile, on its own connection
    started = time.monotonic()
    assert closed_by_peer(peer) and time.monotonic() - started < 4.0  # idle_s 1: the rest had 1 s to come
    peer.close()


def test_an_idle_connection_is_closed_and_its_client_connects_again_without_counting_twice(server):
    client = client_of(server)
    assert client.add("arrived", 1) == 1
    time.sleep(1.5)  # past the server's idle_s: it has closed our connection
    assert client.add("arrived", 1) == 2  # sent again on a new one, once
    # A change sent twice (its connection dropped before the answer came): the second gets the first's answer.
    first, second = raw(server.port), raw(server.port)
    for sock in (first, second):
        send(sock, {"op": "add", "key": "arrived", "by": 1, "client": "node-7", "seq": 1}, time.monotonic() + 5)
        assert receive(sock, time.monotonic() + 5.0) == {"seq": 1, "ok": 3}
    assert client.add("arrived", 0) == 3
    first.close()
    second.close()


def test_a_store_that_never_answers_is_silent_and_every_later_call_fails_at_once():
    with listener(answer=None) as port:
        client = StoreClient("127.0.0.1", port, answer_within=0.5)
        client.connect(5.0)
        started = time.monotonic()
        with pytest.raises(StoreSilent, match=r"rendezvous at 127\.0\.0\.1:\d+ has not answered for 0\.5s"):
            client.add("arrived", 1)
        assert 0.4 < time.monotonic() - started < 3.0
        started = time.monotonic()
        with pytest.raises(StoreSilent):
            client.add("alive/1", 1)
        assert time.monotonic() - started < 0.1


def test_a_peer_that_answers_garbage_or_too_much_is_no_store():
    for answer, words in (
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "over the limit"),  # "HTTP" read as a length
        (struct.pack(">I", 5) + b"hello", "not JSON"),
        (struct.pack(">I", 2) + b"[]", "not a JSON object"),
        (struct.pack(">I", MAX_MESSAGE_BYTES + 1), "over the limit"),
    ):
        with listener(answer) as port:
            client = StoreClient("127.0.0.1", port, answer_within=5.0)
            client.connect(5.0)
            with pytest.raises(WireError, match=words):
                client.hello(5.0)
            no_store = r"what listens at 127\.0\.0\.1:\d+ is no distlaunch rendezvous store"
            with pytest.raises(HostError, match=no_store), NodeStore.open("127.0.0.1", port, 2, 5.0, first=False):
                pass


def test_a_serving_node_that_ends_is_gone_not_silent(server):
    client = client_of(server)
    assert client.add("arrived", 1) == 1
    server.close()
    started = time.monotonic()
    with pytest.raises(StoreGone):
        client.add("arrived", 0)
    assert time.monotonic() - started < 3.0


def test_the_store_listens_only_on_the_address_the_endpoint_names(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0):
        pass
    with pytest.raises(ConnectionRefusedError):  # another address of this machine (127/8 is all loopback)
        socket.create_connection(("127.0.0.2", server.port), timeout=5.0)


def test_node_0_refuses_an_endpoint_that_is_not_its_own_address_once_the_timeout_has_passed():
    started = time.monotonic()
    refused = r"node 0 cannot serve the node rendezvous on 192\.0\.2\.1:\d+: 192\.0\.2\.1 does not resolve"
    with pytest.raises(HostError, match=refused), NodeStore.open("192.0.2.1", free_port(), 2, 1.0, first=True):
        pass
    assert 0.9 < time.monotonic() - started < 5.0


def test_a_client_that_floods_the_store_does_not_keep_it_from_answering_the_others(server):
    flooding, done = client_of(server), threading.Event()

    def flood():
        while not done.is_set():
            flooding.add("arrived", 0)

    threading.Thread(target=flood, daemon=True).start()
    other = client_of(server, answer_within=2.0)  # silent, were it kept waiting 2 s
    try:
        slowest = 0.0
        for _ in range(50):
            started = time.monotonic()
            other.add("alive/1", 1)
            slowest = max(slowest, time.monotonic() - started)
        assert other.get("alive/1") == 50 and slowest < 2.0
    finally:
        done.set()


def test_a_node_whose_store_accepts_but_never_answers_gives_up_after_the_timeout_and_heartbeat_timeout():
    with listener(answer=None) as port:
        started = time.monotonic()
        silent = r"the node serving the rendezvous at 127\.0\.0\.1:\d+ has not answered for 2s"
        with pytest.raises(StoreSilent, match=silent), NodeStore.open("127.0.0.1", port, 2, 1.0, False, {}, 1.0):
            pass
        assert 1.5 < time.monotonic() - started < 6.0

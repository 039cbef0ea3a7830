"""Where the nodes of a per-node job meet: a small key-value store, served by one node's launcher, reached by
the others' (``store_server``, ``store_client``, on the wire of ``store_wire``: standard library only, so a
per-node launcher never imports torch). It has blocking waits with timeouts, atomic counters and
compare-and-set, and a client connects again after a dropped connection. It listens on the address
``--rdzv-endpoint`` names (by default the master address at the master port + 1), never on MASTER_PORT, where
rank 0's init_process_group hosts the ranks' own store.

Keys: ``shape`` (the job as the serving node starts it, set before anyone connects: a node whose own differs is
refused before it counts), ``arrived`` (counter; with no --node-rank the n-th arrival is node n-1),
``node/<i>`` (a node rank given twice is an error), ``job`` (job id and master address from node 0),
``failed`` (the earliest failure any node reported), ``finished`` (counter; the serving node keeps the store up
until every node is done), ``left`` (counter: a node that will not call the store again; the serving node waits
for them, so no node's last call meets a closed store), ``alive/<i>`` (counter: node i's heartbeat while its
ranks run; one that stops moving for the heartbeat timeout is a node gone silent; ``done`` once node i has
finished).
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import time
from collections.abc import Iterator

from distlaunch import interrupts
from distlaunch.contract.hostname import host_port
from distlaunch.errors import HostError, UsageError
from distlaunch.launcher.elastic.store_client import StoreClient, StoreSilent
from distlaunch.launcher.elastic.store_server import StoreServer
from distlaunch.launcher.elastic.store_wire import StoreError
from distlaunch.launcher.planning.spec import is_loopback


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) into its parts."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"--rdzv-endpoint {text!r} is not HOST:PORT", "write e.g. --rdzv-endpoint node0:29400")
    return host, int(port)


def is_own_address(host: str) -> bool:
    """True when ``host`` resolves to an address of this machine (binding to it succeeds)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


POLL_S = 0.5  # between tries to reach the store
LEAVE_S = 5.0  # once every node has finished: how long the serving node waits for the others to leave
DONE = "done"  # a finished node's heartbeat


def listen_host(host: str) -> str | None:
    """Where the serving node listens: the address the endpoint names. But a name (other than localhost) that
    resolves here to loopback only listens on every address (None): Debian and Ubuntu map the machine's own
    name to 127.0.1.1 in /etc/hosts, while the other nodes resolve it to the machine's network address."""
    if host == "localhost":
        return host
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:  # not resolvable (yet): serve waits for it
        return host
    return None if host not in addresses and all(map(is_loopback, addresses)) else host


def serve(host: str, port: int, first: bool | None, timeout: float, values: dict) -> StoreServer | None:
    """The store this node serves (node 0, ``first``; or with ``first=None`` the first node on the endpoint's
    machine), holding ``values``; None when another node serves it. Node 0 waits up to ``timeout`` seconds for
    the endpoint's name to resolve to an address of its own (a pod's DNS record appears as it starts, and may
    name its predecessor's address for a while)."""
    if first is False or (first is None and not is_own_address(host)):
        return None
    endpoint, deadline = host_port(host, port), time.monotonic() + timeout
    while True:
        try:
            return StoreServer.start(listen_host(host), port, values)
        except OSError as exc:
            if not first:  # the port is taken: with --rdzv-endpoint another node here serves it already
                return None
            if exc.errno == errno.EADDRINUSE:
                raise HostError(
                    f"node 0 cannot serve the node rendezvous on {endpoint}: {exc}",
                    "pick a free port with --rdzv-endpoint HOST:PORT (or another --master-port)",
                ) from None
            if time.monotonic() >= deadline:
                raise HostError(
                    f"node 0 cannot serve the node rendezvous on {endpoint}: {host} does not resolve to an address "
                    f"of this machine ({exc})",
                    "give --rdzv-endpoint node 0's own address or name, as the other nodes reach it",
                ) from None
            time.sleep(POLL_S)


def reach(host: str, port: int, timeout: float, answer_within: float, silent_after: float) -> StoreClient:
    """A client of the store another node serves, once it answers; for ``timeout`` seconds a store not served
    yet (refused, or a name that does not resolve yet) is tried again, quietly. One that accepts but does not
    answer its hello is silent (``StoreSilent``), after the time left and the heartbeat timeout."""
    endpoint, deadline = host_port(host, port), time.monotonic() + timeout
    client = StoreClient(host, port, answer_within)
    while True:
        left = deadline - time.monotonic()
        try:
            client.connect(min(1.0, max(0.1, left)))
            client.hello(max(1.0, left) + max(silent_after, 1.0))
            return client
        except StoreError as exc:  # it answers, but not as a store of ours
            raise HostError(
                f"what listens at {endpoint} is no distlaunch rendezvous store ({exc})",
                "start every node with the same distlaunch, and check --rdzv-endpoint's port",
            ) from None
        except OSError:  # refused, unreachable, or a name that does not resolve yet
            if left <= 0:
                raise HostError(
                    f"node rendezvous at {endpoint} not reachable within {timeout:g}s: no node serves it",
                    "start node 0 (or the first node on that host) and check the address and port",
                ) from None
            time.sleep(min(POLL_S, left))


class NodeStore:
    """One node's view of the nodes' store; ``host`` is True on the node that serves it, whose own calls are
    answered in process. On the others, a call not answered within the heartbeat timeout (else the rendezvous
    timeout) makes the store silent (``StoreSilent``)."""

    def __init__(self, store, endpoint: str, nnodes: int, timeout: float, host: bool, shape: dict | None = None):
        self.store, self.endpoint, self.nnodes, self.timeout, self.host = store, endpoint, nnodes, timeout, host
        self.shape = shape or {}  # option -> value: what every node of the job must start alike
        self._finished = False
        self._counted = False  # this node's arrival counts: it finishes and leaves as one of the nodes
        self.node_rank: int | None = None  # once arrived
        self._beats: dict[int, tuple[int, float]] = {}  # node -> its last heartbeat count, and since when (ours)

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        host: str,
        port: int,
        nnodes: int,
        timeout: float,
        first: bool | None,
        shape: dict | None = None,
        silent_after: float = 0.0,
    ) -> Iterator[NodeStore]:
        """Serve the store (node 0; ``first=None``: the first node on the endpoint's machine), else reach it.
        ``shape``: this node's job (option -> value), which the serving node holds for the others to match;
        ``silent_after``: the heartbeat timeout after which the serving node stops waiting for a node (0: never)."""
        server = serve(host, port, first, timeout, {"shape": shape or {}})
        store = server or reach(host, port, timeout, silent_after or timeout, silent_after)
        node = cls(store, host_port(host, port), nnodes, timeout, server is not None, shape)
        try:
            yield node
        finally:
            try:
                node.linger(silent_after) if server else node.leave()
            finally:
                store.close()

    def served_shape(self) -> dict | None:
        """The job as the serving node starts it (``shape``)."""
        return self.store.get("shape")

    def arrive(self, node_rank: int | None) -> int:
        """Check in; returns this node's rank (the given one, or the arrival order). A given rank is claimed
        before the arrival counts, so a node refused for a rank already taken never counts, not for a moment:
        the others would see every node arrived, and start without the node they still lack. By arrival
        order, a node past --nnodes counts for a moment, when every node has arrived anyway."""
        if node_rank is None:
            order = self.store.add("arrived", 1)
            if order > self.nnodes:
                self.store.add("arrived", -1)
                raise UsageError(
                    f"more than --nnodes {self.nnodes} nodes arrived at {self.endpoint}",
                    "start exactly N nodes, or raise --nnodes",
                )
            self._counted = True
            self.node_rank = order - 1
            self.store.add(f"alive/{self.node_rank}", 0)
            return order - 1
        if self.store.add(f"node/{node_rank}", 1) > 1:
            self.store.add(f"node/{node_rank}", -1)
            raise UsageError(f"--node-rank {node_rank} was given to two nodes", "give every node its own rank")
        self.store.add(f"alive/{node_rank}", 0)  # there before the others can start and look for it
        self.store.add("arrived", 1)
        self._counted = True
        self.node_rank = node_rank
        return node_rank

    def all_arrived(self) -> bool:
        """Whether every node has arrived (so the others go on); True when the store cannot say."""
        try:
            return self.store.add("arrived", 0) >= self.nnodes
        except Exception:
            return True

    def withdraw(self, node_rank: int) -> None:
        """Take this node's arrival back (it stops before every node arrived: Ctrl-C, a timeout), so the others
        keep waiting for it, and it may come again with its node rank."""
        if not self._counted:
            return
        self._counted = False
        with contextlib.suppress(Exception):  # the arrival first, the rank after: arrive's order, reversed
            self.store.add("arrived", -1)
            self.store.add(f"node/{node_rank}", -1)

    def wait_all(self) -> None:
        """Block until every node has arrived, or fail naming how many did."""
        deadline = time.monotonic() + self.timeout
        while (arrived := self.store.add("arrived", 0)) < self.nnodes:
            if time.monotonic() > deadline:
                raise HostError(
                    f"node rendezvous at {self.endpoint} timed out after {self.timeout:g}s: "
                    f"{arrived} of {self.nnodes} nodes arrived",
                    "start distlaunch run --nnodes on every node, or raise --rdzv-timeout",
                )
            interrupts.check()  # a Ctrl-C its store calls swallowed ends the wait here
            time.sleep(0.1)

    def publish_job(self, job_id: str, master_addr: str, master_port: int) -> None:
        """Node 0's job id and master address, for the other nodes (``job``)."""
        self.store.set("job", [job_id, master_addr, master_port])

    def job(self) -> tuple[str, str, int]:
        """Node 0's job id, master address and port (waits for node 0 to publish them)."""
        try:
            job_id, addr, port = self.store.wait("job", self.timeout)
        except StoreSilent:
            raise
        except Exception:
            raise HostError(
                f"node 0 did not publish the job at {self.endpoint} within {self.timeout:g}s", "check node 0's output"
            ) from None
        return job_id, addr, int(port)

    def publish_failure(self, failure: dict) -> None:
        """Tell the other nodes. The store keeps the earliest failure by its ``at`` (the root cause), not the
        first reported: compare-and-set until ours is in or an earlier one is."""
        ours, expected = json.loads(json.dumps(failure)), None  # as the store hands it back, to compare with
        with contextlib.suppress(Exception):  # the serving node may be gone already
            while (kept := self.store.compare_set("failed", expected, ours)) != ours:
                if kept["at"] <= failure["at"]:
                    return
                expected = kept

    def failure(self) -> dict | None:
        """The earliest failure any node reported, or None."""
        return self.store.get("failed")

    def beat(self) -> None:
        """This node is alive (its launcher runs): a heartbeat the other nodes watch."""
        self.store.add(f"alive/{self.node_rank}", 1)

    def heartbeats(self) -> list:
        """Every node's heartbeat, in one call (the serving node answers every node, every half second):
        a count, or ``done`` once that node finished, or ``done`` too for a node that never arrived."""
        beats = self.store.get_many([f"alive/{node}" for node in range(self.nnodes)])
        return [DONE if count is None else count for count in beats]

    def silent_nodes(self, timeout: float) -> list[int]:
        """The other nodes not finished whose heartbeat has not moved for ``timeout`` seconds (by our clock,
        from our first look): their launcher died with its host, or was killed outright."""
        now, silent = time.monotonic(), []
        for node, count in enumerate(self.heartbeats()):
            if node == self.node_rank or count == DONE:
                continue
            seen, since = self._beats.get(node, (None, now))
            if count != seen:
                self._beats[node] = (count, now)
            elif now - since > timeout:
                silent.append(node)
        return silent

    def finish(self) -> None:
        """This node is done: its heartbeat ends (nobody waits for it), and it counts as finished."""
        if self._finished or not self._counted:
            return
        self._finished = True
        with contextlib.suppress(Exception):
            self.store.set(f"alive/{self.node_rank}", DONE)
            self.store.add("finished", 1)

    def wait_finished(self, timeout: float) -> None:
        """Until every node that arrived has finished (and so published its failure, if any), or the timeout."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(Exception):
            while self.store.add("finished", 0) < self.store.add("arrived", 0) and time.monotonic() < deadline:
                time.sleep(0.1)

    def wait_finished_or_silent(self, silent_after: float) -> None:
        """Until every node that arrived has finished or gone silent (the store answering nothing ends it too)."""
        with contextlib.suppress(Exception):
            while self.store.add("finished", 0) < self.store.add("arrived", 0):
                running = {node for node, count in enumerate(self.heartbeats()) if count != DONE}
                if running - {self.node_rank} <= set(self.silent_nodes(silent_after)):
                    return
                time.sleep(POLL_S)

    def leave(self) -> None:
        """A node that does not serve the store makes its last call: it has finished and will not come back."""
        self.finish()  # also when it leaves early with an error
        if not self._counted:  # refused or withdrawn: it was never one of the nodes
            return
        with contextlib.suppress(Exception):
            self.store.add("left", 1)

    def linger(self, silent_after: float = 0.0) -> None:
        """The serving node keeps the store up until every node has finished, then until the others have left:
        a node reads the root cause after the last one finished. A node whose heartbeat stopped for
        ``silent_after`` seconds (its launcher died) is not waited for; without heartbeats (0), the timeout."""
        self.finish()  # this node too, also when it leaves early with an error
        if silent_after:
            self.wait_finished_or_silent(silent_after)
        else:
            self.wait_finished(self.timeout)
        deadline = time.monotonic() + LEAVE_S
        with contextlib.suppress(Exception):
            while self.store.add("left", 0) < self.store.add("arrived", 0) - 1 and time.monotonic() < deadline:
                time.sleep(0.05)

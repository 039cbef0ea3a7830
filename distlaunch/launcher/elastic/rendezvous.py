"""Where the nodes of a per-node job meet: a TCP key-value store, hosted by one node, reached by the others.

The store is torch's ``TCPStore``, the same store torchrun's c10d rendezvous uses: it already has
blocking gets with timeouts, atomic counters and reconnection, so distlaunch writes no wire protocol of
its own. torch is imported inside ``NodeStore.open`` only, so the launcher still starts without it and
only per-node launches pay for the import. It listens on its own port (``--rdzv-endpoint``, by default
the master port + 1), never on MASTER_PORT, where rank 0's init_process_group hosts the ranks' store.

Keys: ``shape`` (the job as the serving node starts it: a node whose own differs is refused before it
counts), ``arrived`` (counter; with no --node-rank the n-th arrival is node n-1), ``node/<i>`` (a node rank
given twice is an error), ``job`` (job id and master address from node 0), ``failed`` (the earliest failure
any node reported), ``finished`` (counter; the hosting node keeps the store up until every node is done),
``left`` (counter: a node that will not call the store again; the hosting node waits for them, so no node's
last call meets a closed store), ``alive/<i>`` (counter: node i's heartbeat while its ranks run; one that
stops moving for the heartbeat timeout is a node gone silent; ``done`` once node i has finished).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

from distlaunch.contract.hostname import host_port
from distlaunch.errors import HostError, UsageError


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
LEAVE_S = 5.0  # once every node has finished: how long the hosting node waits for the others to leave
DONE = b"done"  # a finished node's heartbeat
SHAPE_WAIT_S = 5.0  # how long a node looks for the serving node's shape (set as it starts the store; an older
# distlaunch sets none, and then nothing is compared)


def tcp_store_class():
    """torch's TCPStore, imported with its C++ warnings off in this process: a store that went away is handled
    here in one line, never with the C++ stack torch prints for each failed call. Our own setting of the
    variable ends with the import, so the ranks get the user's environment unchanged."""
    import os

    ours = "TORCH_CPP_LOG_LEVEL" not in os.environ
    if ours:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"  # read once, when torch's libraries load
    try:
        from torch.distributed import TCPStore  # lazily: only per-node launches need torch here
    finally:
        if ours:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    return TCPStore


def wait_until_served(host: str, port: int, deadline: float) -> bool:
    """Whether something listens on HOST:PORT before the (monotonic) deadline, tried with plain connects.

    The nodes that start before node 0 wait here, not in torch's store client: that client prints a C++
    stack for every failed try and overruns its timeout by its retry backoff.
    """
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(0.1, left))):
                return True
        except OSError:  # refused, unreachable, or a name that does not resolve yet
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))


class Unanswered(TimeoutError):
    """A call that got no answer in its time (``answered_within``)."""

    def __init__(self, seconds: float):
        super().__init__(f"no answer within {seconds:g}s")
        self.seconds = seconds


def answered_within(seconds: float, call, *args):
    """``call(*args)``'s result (or error), or Unanswered after ``seconds``. torch's store client waits for a
    reply for good, whatever its timeout says: a peer that hangs, or whose host is cut off with the connection
    open, would hold the caller with it. So the call runs on a thread of its own, which such a peer keeps."""
    reply: list = []
    answered = threading.Event()

    def run():
        try:
            reply.append(call(*args))
        except BaseException as exc:  # handed to the caller as is
            reply.append(exc)
        finally:
            answered.set()

    threading.Thread(target=run, name="rendezvous-call", daemon=True).start()
    if not answered.wait(seconds):
        raise Unanswered(seconds)
    if isinstance(reply[0], BaseException):
        raise reply[0]
    return reply[0]


class StoreSilent(HostError):
    """The store did not answer a call within its time: the node serving it hangs, or cannot be reached."""

    cause = "its launcher hangs or was stopped, or its host cannot be reached"

    def __init__(self, endpoint: str, seconds: float):
        super().__init__(
            f"the node serving the rendezvous at {endpoint} has not answered for {seconds:g}s",
            f"{self.cause}; check that node",
        )


class NodeStore:
    """One node's view of the nodes' store; ``host`` is True on the node that serves it. A call not answered
    within ``answer_within`` seconds (the heartbeat timeout; else the rendezvous timeout) makes it silent."""

    def __init__(
        self,
        store,
        endpoint: str,
        nnodes: int,
        timeout: float,
        host: bool,
        shape: dict | None = None,
        answer_within: float = 0.0,
    ):
        self.store, self.endpoint, self.nnodes, self.timeout, self.host = store, endpoint, nnodes, timeout, host
        self.shape = shape or {}  # option -> value: what every node of the job must start alike
        self.answer_within = answer_within or timeout
        self.silent_for: float | None = None  # once a call went unanswered: how long it waited
        self._lock = threading.Lock()  # the watcher thread and the launcher share one client
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
        ``shape``: this node's job (option -> value), which the serving node sets for the others to match;
        ``silent_after``: the heartbeat timeout after which the serving node stops waiting for a node (0: never)."""
        TCPStore = tcp_store_class()
        endpoint = host_port(host, port)
        wait = timedelta(seconds=timeout)
        store, serving = None, False
        if first or (first is None and is_own_address(host)):
            try:
                store, serving = TCPStore(host, port, None, True, wait, wait_for_workers=False), True
            except Exception as exc:  # port taken: with --rdzv-endpoint another node here serves it already
                if first:
                    raise HostError(
                        f"node 0 cannot serve the node rendezvous on {endpoint}: {exc}",
                        "pick a free port with --rdzv-endpoint HOST:PORT (or another --master-port)",
                    ) from None
        deadline = time.monotonic() + timeout
        while store is None:
            try:
                if not wait_until_served(host, port, deadline):
                    raise TimeoutError
                left = max(1.0, deadline - time.monotonic())
                store = answered_within(
                    left + max(silent_after, 1.0), TCPStore, host, port, None, False, timedelta(seconds=left)
                )
            except Unanswered as exc:  # it listens (the kernel accepts), but its process answers nothing
                raise StoreSilent(endpoint, round(exc.seconds)) from None
            except Exception:  # also a name not resolvable yet (a pod's DNS record appears when it starts)
                if time.monotonic() >= deadline:
                    raise HostError(
                        f"node rendezvous at {endpoint} not reachable within {timeout:g}s: no node serves it",
                        "start node 0 (or the first node on that host) and check the address and port",
                    ) from None
                time.sleep(POLL_S)
        store.set_timeout(wait)  # blocking gets wait the whole --rdzv-timeout, whatever connecting took
        node = cls(store, endpoint, nnodes, timeout, serving, shape, answer_within=silent_after)
        try:
            if serving:
                node._call("set", "shape", json.dumps(node.shape))
            yield node
        finally:
            node.linger(silent_after) if serving else node.leave()

    def _call(self, name: str, *args, wait: float = 0.0):
        """One call to the store, answered within ``answer_within`` seconds (plus ``wait`` for a blocking get), or
        the store is taken as silent: torch's client waits for a reply for good, so a serving node that hangs, or
        whose host is cut off with its connections open, would hold this node (and its ranks) with it. Once
        silent, every later call fails at once: the node ends without another wait."""
        with self._lock:
            if self.silent_for is not None:
                raise StoreSilent(self.endpoint, self.silent_for)
            try:
                return answered_within(wait + self.answer_within, getattr(self.store, name), *args)
            except Unanswered:
                self.silent_for = self.answer_within
                raise StoreSilent(self.endpoint, self.silent_for) from None

    def served_shape(self) -> dict | None:
        """The job as the serving node starts it (``shape``); None when it set none (an older distlaunch)."""
        deadline = time.monotonic() + SHAPE_WAIT_S
        while not self._call("check", ["shape"]):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return json.loads(self._call("get", "shape"))

    def arrive(self, node_rank: int | None) -> int:
        """Check in; returns this node's rank (the given one, or the arrival order). A given rank is claimed
        before the arrival counts, so a node refused for a rank already taken never counts, not for a moment:
        the others would see every node arrived, and start without the node they still lack. By arrival
        order, a node past --nnodes counts for a moment, when every node has arrived anyway."""
        if node_rank is None:
            order = self._call("add", "arrived", 1)
            if order > self.nnodes:
                self._call("add", "arrived", -1)
                raise UsageError(
                    f"more than --nnodes {self.nnodes} nodes arrived at {self.endpoint}",
                    "start exactly N nodes, or raise --nnodes",
                )
            self._counted = True
            self.node_rank = order - 1
            self._call("add", f"alive/{self.node_rank}", 0)
            return order - 1
        if self._call("add", f"node/{node_rank}", 1) > 1:
            self._call("add", f"node/{node_rank}", -1)
            raise UsageError(f"--node-rank {node_rank} was given to two nodes", "give every node its own rank")
        self._call("add", f"alive/{node_rank}", 0)  # there before the others can start and look for it
        self._call("add", "arrived", 1)
        self._counted = True
        self.node_rank = node_rank
        return node_rank

    def beat(self) -> None:
        """This node is alive (its launcher runs): a heartbeat the other nodes watch."""
        self._call("add", f"alive/{self.node_rank}", 1)

    def heartbeats(self) -> list[bytes]:
        """Every node's heartbeat, in one call (the serving node answers every node, every half second):
        a count, or ``done`` once that node finished, or ``done`` too for a node that never arrived."""
        keys = [f"alive/{node}" for node in range(self.nnodes)]
        if self._call("check", keys):
            return self._call("multi_get", keys)
        return [self._call("get", key) if self._call("check", [key]) else DONE for key in keys]

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

    def all_arrived(self) -> bool:
        """Whether every node has arrived (so the others go on); True when the store cannot say."""
        try:
            return self._call("add", "arrived", 0) >= self.nnodes
        except Exception:
            return True

    def withdraw(self, node_rank: int) -> None:
        """Take this node's arrival back (it stops before every node arrived: Ctrl-C, a timeout), so the others
        keep waiting for it, and it may come again with its node rank."""
        if not self._counted:
            return
        self._counted = False
        with contextlib.suppress(Exception):  # the arrival first, the rank after: arrive's order, reversed
            self._call("add", "arrived", -1)
            self._call("add", f"node/{node_rank}", -1)

    def wait_all(self) -> None:
        """Block until every node has arrived, or fail naming how many did."""
        deadline = time.monotonic() + self.timeout
        while (arrived := self._call("add", "arrived", 0)) < self.nnodes:
            if time.monotonic() > deadline:
                raise HostError(
                    f"node rendezvous at {self.endpoint} timed out after {self.timeout:g}s: "
                    f"{arrived} of {self.nnodes} nodes arrived",
                    "start distlaunch run --nnodes on every node, or raise --rdzv-timeout",
                )
            time.sleep(0.1)

    def publish_job(self, job_id: str, master_addr: str, master_port: int) -> None:
        self._call("set", "job", json.dumps([job_id, master_addr, master_port]))

    def job(self) -> tuple[str, str, int]:
        """Node 0's job id, master address and port (waits for node 0 to publish them)."""
        try:
            job_id, addr, port = json.loads(self._call("get", "job", wait=self.timeout))
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
        ours, expected = json.dumps(failure), ""
        with contextlib.suppress(Exception):  # the hosting node may be gone already
            while (kept := self._call("compare_set", "failed", expected, ours).decode()) != ours:
                if json.loads(kept)["at"] <= failure["at"]:
                    return
                expected = kept

    def failure(self) -> dict | None:
        if not self._call("check", ["failed"]):
            return None
        return json.loads(self._call("get", "failed"))

    def finish(self) -> None:
        if self._finished or not self._counted:
            return
        self._finished = True
        with contextlib.suppress(Exception):
            self._call("set", f"alive/{self.node_rank}", DONE)  # its heartbeat ends here: nobody waits for it
            self._call("add", "finished", 1)

    def wait_finished(self, timeout: float) -> None:
        """Until every node that arrived has finished (and so published its failure, if any), or the timeout."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(Exception):
            while self._call("add", "finished", 0) < self._call("add", "arrived", 0) and time.monotonic() < deadline:
                time.sleep(0.1)

    def wait_finished_or_silent(self, silent_after: float) -> None:
        """Until every node that arrived has finished or gone silent (the store answering nothing ends it too)."""
        with contextlib.suppress(Exception):
            while self._call("add", "finished", 0) < self._call("add", "arrived", 0):
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
            self._call("add", "left", 1)

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
            while self._call("add", "left", 0) < self._call("add", "arrived", 0) - 1 and time.monotonic() < deadline:
                time.sleep(0.05)

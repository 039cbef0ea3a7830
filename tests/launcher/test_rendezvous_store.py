"""The nodes' rendezvous itself (``launcher/elastic/rendezvous.NodeStore``), on a real store on loopback."""

import subprocess
import sys

import pytest

from distlaunch.contract.endpoint import free_port
from distlaunch.errors import UsageError
from distlaunch.launcher.elastic.rendezvous import NodeStore
from tests.helpers import wait_until

# Another node's view of the count, polled as fast as the store answers until told to stop: the largest
# count it read, and how many reads. A process of its own, so its polling and the nodes' calls never take
# turns on one interpreter.
WATCHER = """
import sys
from distlaunch.launcher.elastic.store_client import StoreClient
store = StoreClient("127.0.0.1", int(sys.argv[1]), 30.0)
store.set("watching", "1")
most, reads = 0, 0
while store.get("stop") is None:
    most, reads = max(most, store.add("arrived", 0)), reads + 1
print(most, reads)
"""


def test_a_node_refused_for_a_taken_rank_never_counts_as_arrived_not_even_for_a_moment():
    """Nodes 0 and 1 of 3 have arrived when a second --node-rank 1 comes, again and again. Had its arrival
    counted before its rank was checked, the others, polling the count, could see 3 of 3 for a moment and
    start without node 2: a job short of a node, whose ranks hang. A watcher polls the count the whole
    time; it never reads more than 2."""
    port = free_port()
    with NodeStore.open("127.0.0.1", port, 3, 10.0, first=True) as serving:
        assert serving.arrive(0) == 0
        with NodeStore.open("127.0.0.1", port, 3, 10.0, first=False) as node1:
            assert node1.arrive(1) == 1
            watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(port)], stdout=subprocess.PIPE, text=True)
            try:
                assert wait_until(lambda: serving.store.get("watching"), timeout=60)
                for _ in range(20):
                    with (
                        NodeStore.open("127.0.0.1", port, 3, 10.0, first=False) as dup,
                        pytest.raises(UsageError, match="--node-rank 1 was given to two nodes"),
                    ):
                        dup.arrive(1)
            finally:
                serving.store.set("stop", "1")
                try:
                    out, _ = watcher.communicate(timeout=60)
                finally:
                    watcher.kill()  # ours, by pid: none is left behind, whatever failed
            most, reads = map(int, out.split())
            assert reads > 20 and most == 2, f"{reads} reads, at most {most}"
            node1.withdraw(1)  # it may come again with its rank, and counts once
            assert serving.store.add("arrived", 0) == 1
            with NodeStore.open("127.0.0.1", port, 3, 10.0, first=False) as again:
                assert again.arrive(1) == 1
                assert serving.store.add("arrived", 0) == 2

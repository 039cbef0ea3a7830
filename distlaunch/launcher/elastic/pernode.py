"""Per-node mode (torchrun's multi-node form): one ``distlaunch run --nnodes N`` per node forms one job.

Each node builds the whole job's plan with ``build_plan`` (so ranks, environment and groups are exactly
those of a single ``-H`` launch: rank = node_rank * n + local_rank) and starts only its own part. The
nodes meet at a small key-value store (see ``rendezvous``): there they get node ranks on arrival (with
``--rdzv-endpoint`` and no ``--node-rank``), share the job id and master address, and tell each other
when a rank failed, so every node stops its ranks (fail-fast across nodes).
"""

from __future__ import annotations

import threading
import time

from distlaunch.contract.endpoint import choose_port
from distlaunch.contract.options import LaunchOptions, NodeOptions
from distlaunch.contract.report import HOST_SILENT_CODE, RankExit, RunReport
from distlaunch.contract.sink import Sink
from distlaunch.errors import DistlaunchError, ExitCode, Interrupted, UsageError
from distlaunch.launcher.elastic.rendezvous import NodeStore, parse_endpoint
from distlaunch.launcher.elastic.store_client import StoreSilent
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import LaunchPlan, build_plan
from distlaunch.launcher.planning.spec import address_for_peer, make_spec
from distlaunch.launcher.supervising.requests import StopRequest

POLL_S = 0.5  # how often a node looks for another node's failure
SETTLE_S = 2.0  # past the grace period: how long a failed node waits for the others' reports of their failures


def check_node_options(opts: LaunchOptions, node: NodeOptions, max_restarts: int = 0) -> None:
    """Reject combinations that cannot form a job, with one line that says how to fix it."""
    if node.nnodes < 1:
        raise UsageError(f"--nnodes {node.nnodes} must be at least 1", "give the number of nodes, e.g. --nnodes 2")
    if opts.hostfile is not None or opts.include or opts.exclude:
        raise UsageError(
            "--nnodes runs one distlaunch per node and does not take -H/--include/--exclude",
            "either start distlaunch run --nnodes N --node-rank I on every node, or one distlaunch run -H HOSTFILE",
        )
    if node.node_rank is not None and not 0 <= node.node_rank < node.nnodes:
        raise UsageError(
            f"--node-rank {node.node_rank} is out of range for --nnodes {node.nnodes}",
            f"give a node rank from 0 to {node.nnodes - 1}",
        )
    if node.rdzv_timeout <= 0:
        raise UsageError(f"--rdzv-timeout {node.rdzv_timeout:g} must be positive", "give seconds, e.g. 300")
    if max_restarts:
        raise UsageError(
            "--max-restarts is not supported with --nnodes",
            "restart the nodes instead (Kubernetes: the Job's backoffLimit; see docs/kubernetes.md)",
        )
    if node.rdzv_endpoint is not None:
        parse_endpoint(node.rdzv_endpoint)
        return
    if node.nnodes > 1 and node.node_rank is None:
        raise UsageError(
            f"--nnodes {node.nnodes} needs --node-rank or --rdzv-endpoint",
            "give --node-rank I --master-addr HOST --master-port P, or --rdzv-endpoint HOST:PORT",
        )
    if node.nnodes > 1 and (opts.master_addr is None or opts.master_port == "auto"):
        raise UsageError(
            "--node-rank needs --master-addr and an integer --master-port, the same on every node",
            "give --master-addr HOST (node 0's address) --master-port P",
        )


def store_endpoint(opts: LaunchOptions, node: NodeOptions) -> tuple[str, int]:
    """Where the nodes meet: --rdzv-endpoint, else the master address at the master port + 1.

    Not the master port itself: rank 0's init_process_group listens there for the ranks' own store.
    """
    if node.rdzv_endpoint is not None:
        return parse_endpoint(node.rdzv_endpoint)
    port = choose_port(opts.master_port, master_is_local=False) + 1  # an integer here: checked by check_node_options
    if port > 65535:
        raise UsageError(
            f"--master-port {opts.master_port} leaves no port for the nodes' store", "give --rdzv-endpoint"
        )
    return opts.master_addr or "127.0.0.1", port


def node_plan(
    opts: LaunchOptions,
    nnodes: int,
    node_rank: int,
    job_id: str | None = None,
    workdir: str | None = None,
    flight_recorder: bool = False,
) -> LaunchPlan:
    """The whole job's plan, built as for a hostfile of ``nnodes`` equal nodes, cut down to this node's part;
    its ranks start in ``workdir`` (--workdir; default: the current directory), where their program is checked."""
    # this machine's slots, backend, env, port; every node has the same count
    spec = make_spec(opts, workdir=workdir, flight_recorder=flight_recorder)
    slots = spec.hosts[0].slots
    hosts = [HostSlots(host="localhost" if i == node_rank else f"node{i}", slots=slots) for i in range(nnodes)]
    spec = spec.model_copy(update={"hosts": hosts, **({"job_id": job_id} if job_id else {})})
    plan = build_plan(spec)
    return plan.model_copy(update={"nodes": [plan.nodes[node_rank]]})


def dry_run_plan(
    opts: LaunchOptions, node: NodeOptions, workdir: str | None = None, flight_recorder: bool = False
) -> LaunchPlan:
    """This node's part without meeting the others (with --rdzv-endpoint: the part of the node that arrives first)."""
    check_node_options(opts, node)
    if node.node_rank is None and node.rdzv_endpoint is not None:
        host, _ = parse_endpoint(node.rdzv_endpoint)
        opts = opts.model_copy(update={"master_addr": opts.master_addr or host})
    return node_plan(opts, node.nnodes, node.node_rank or 0, workdir=workdir, flight_recorder=flight_recorder)


def master_for_first_node(opts: LaunchOptions, store_host: str) -> tuple[str, int]:
    """Node 0's master address and port as the other nodes reach them (only asked when not given): node 0's
    address on its route to the nodes' store, which every node reaches, by the rule of a hostfile launch."""
    addr = opts.master_addr or address_for_peer(store_host)
    return addr, choose_port(opts.master_port, master_is_local=True)


def job_shape(plan: LaunchPlan, nnodes: int) -> dict[str, str | int]:
    """What every node must start alike (option -> value): the ranks' numbers and groups follow from these."""
    return {
        "--nnodes": nnodes,
        "-n": len(plan.nodes[0].ranks),
        "--parallel": str(plan.parallel),
        "--backend": plan.backend,
    }


def check_shape(mine: dict, theirs: dict | None, endpoint: str) -> None:
    """Refuse this node before it counts when its job differs from the serving node's (another -n, layout,
    backend): its ranks would take numbers and groups the others do not expect, and every rank would hang."""
    differ = [f"{k} {v} here, {theirs[k]} there" for k, v in mine.items() if theirs and k in theirs and theirs[k] != v]
    if differ:
        raise UsageError(
            f"this node starts another job than the node serving the rendezvous at {endpoint}: {'; '.join(differ)}",
            f"start every node with the same {', '.join(mine)} (--backend auto picks nccl on a node with GPUs, "
            "gloo on one without)",
        )


def tell_others(store: NodeStore, node_rank: int, exc: BaseException) -> None:
    """This node stops before its ranks ran (``exc``): the other nodes' ranks must not wait for them."""
    if isinstance(exc, DistlaunchError | Interrupted):
        code = int(exc.exit_code)
    else:
        code = int(ExitCode.SIGINT if isinstance(exc, KeyboardInterrupt) else ExitCode.CHECK_FAILED)
    store.publish_failure({"node_rank": node_rank, "rank": None, "exit_code": code, "at": time.time()})


def settle(
    store: NodeStore, watcher: FailureWatcher, report: RunReport, node_rank: int, sink: Sink, grace_period: float
) -> RunReport:
    """Publish this node's failure, wait for the other nodes' (the rank that failed first may be reported
    last), and report the earliest as the root cause: this node's own, or a rank of another node."""
    stopped_by_other = report.stopped_by is not None
    own = report.failures[0] if report.failures else None
    if report.exit_code != 0 and not stopped_by_other:
        at = own.at if own else time.time()
        store.publish_failure(
            {
                "node_rank": node_rank,
                "rank": own.rank if own else None,
                "exit_code": report.exit_code,
                "at": at,
                "time_s": own.time_s if own else 0.0,  # into its node's job: the nodes started together
            }
        )
    store.finish()
    if report.exit_code == 0 and watcher.failure is None:
        return report
    # Every node stops within its grace period of the first failure; then each has published its own.
    store.wait_finished(grace_period + SETTLE_S)
    root = _failure(store) or watcher.failure
    if root is None or root["node_rank"] == node_rank:
        return report
    where, code = f"node {root['node_rank']}", root["exit_code"]
    if stopped_by_other:  # the root cause may be another node's than the one that stopped us: it failed earlier
        failures = [] if root["rank"] is None else [_remote_cause(root, time_s=root.get("time_s", 0.0))]
        return report.model_copy(update={"exit_code": code, "stopped_by": describe(root), "failures": failures})
    if own is not None and root["rank"] is not None and root["at"] < own.at:
        earlier = own.at - root["at"]
        sink.notice(
            f"rank {root['rank']} on {where} failed with code {code}, {earlier:.3f}s before rank {own.rank} here: "
            "it failed first (the root cause)"
        )
        cause = _remote_cause(root, time_s=max(0.0, round(own.time_s - earlier, 3)))  # another clock: never < 0
        return report.model_copy(update={"exit_code": code, "failures": [cause, *report.failures]})
    return report


def describe(failure: dict) -> str:
    """Another node's failure in words, as a reason to stop this node."""
    where, code = f"node {failure['node_rank']}", failure["exit_code"]
    if failure["rank"] is None:  # that node was interrupted, or could not run its part: its output says why
        return f"{where} ended with code {code}, with no rank failing there"
    return f"rank {failure['rank']} on {where} failed with code {code}"


def _remote_cause(root: dict, time_s: float = 0.0) -> RankExit:
    """Another node's failure as it reported it (its rank's output stays on that node)."""
    where = f"node {root['node_rank']}"
    return RankExit(
        rank=root["rank"], host=where, exit_code=root["exit_code"], tail=[f"(on {where})"], time_s=time_s, at=root["at"]
    )


def _failure(store: NodeStore) -> dict | None:
    try:
        return store.failure()
    except Exception:  # the hosting node is gone: what the watcher saw is all there is
        return None


class FailureWatcher:
    """Polls the store for another node's failure; on one, asks this node's job to stop (``stop_request``):
    every rank stops in order, as on a Ctrl-C, and the job ends with that failure's exit code. It also beats
    this node's heartbeat and watches the others': a node silent for ``silent_after`` seconds (its launcher
    killed outright, its host down), or a store that no longer answers (the serving node gone), stops the job
    as a host gone silent does in a hostfile launch: exit 3."""

    def __init__(self, store: NodeStore, silent_after: float = 0.0):
        self.store, self.silent_after = store, silent_after
        self.failure: dict | None = None
        self.stop_request = StopRequest()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            slept_at = time.monotonic()
            if self._done.wait(POLL_S):
                return
            away = time.monotonic() - slept_at - POLL_S
            if self.silent_after and away > self.silent_after:  # no other node saw a heartbeat from us meanwhile
                self.stop_request.ask(
                    f"this node's launcher did not run for {away:.0f}s, longer than --heartbeat-timeout "
                    f"{self.silent_after:g}s (it was stopped, or its host froze): the other nodes have given it up",
                    HOST_SILENT_CODE,
                )
                return
            try:
                self.store.beat()
                failure = self.store.failure()
                silent = self.store.silent_nodes(self.silent_after) if self.silent_after and not failure else []
            except StoreSilent as exc:  # its node hangs, or is cut off with its connections open
                self.stop_request.ask(f"{exc.message} ({exc.cause})", HOST_SILENT_CODE)
                return
            except Exception:  # the store is gone with the node that served it
                self.stop_request.ask(
                    f"the node serving the rendezvous at {self.store.endpoint} is gone (its launcher ended, or its "
                    "host went down)",
                    HOST_SILENT_CODE,
                )
                return
            if silent:
                nodes = ", ".join(map(str, silent))
                self.stop_request.ask(
                    f"node {nodes} went silent: no heartbeat at the rendezvous for {self.silent_after:g}s "
                    "(--heartbeat-timeout); its launcher was killed outright, or its host is down",
                    HOST_SILENT_CODE,
                )
                return
            if failure is None:
                continue
            self.failure = failure
            self.stop_request.ask(describe(failure), failure["exit_code"])
            return

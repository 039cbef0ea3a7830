"""This node's part of a per-node job (``--nnodes``, torchrun's multi-node form): meet the other nodes at the
rendezvous (``elastic/pernode.py``), launch this node's ranks as any launch does, and settle the job's outcome
with the other nodes' failures."""

from __future__ import annotations

from distlaunch.contract.hostname import host_port
from distlaunch.contract.options import ExecOptions, LaunchOptions, NodeOptions
from distlaunch.contract.report import RunReport
from distlaunch.contract.sink import Sink
from distlaunch.launcher.elastic.pernode import (
    FailureWatcher,
    check_node_options,
    check_shape,
    job_shape,
    master_for_first_node,
    node_plan,
    settle,
    store_endpoint,
    tell_others,
)
from distlaunch.launcher.elastic.rendezvous import NodeStore
from distlaunch.launcher.planning.spec import make_spec
from distlaunch.launcher.running.launch import launch


def launch_node(opts: LaunchOptions, node: NodeOptions, exec_opts: ExecOptions, sink: Sink) -> RunReport:
    """Meet the other nodes, run this node's ranks, and stop them when a rank fails on any node."""
    check_node_options(opts, node, exec_opts.max_restarts)
    if node.nnodes == 1 and node.rdzv_endpoint is None:  # a job of one node: nobody to meet
        alone = node_plan(opts, 1, 0, workdir=exec_opts.workdir, flight_recorder=exec_opts.flight_recorder)
        return launch(alone, opts, exec_opts, sink)
    host, port = store_endpoint(opts, node)
    # this node's part as the job will have it (the master is not known yet: no name is looked up for it)
    draft = node_plan(
        opts.model_copy(update={"master_addr": opts.master_addr or host}), node.nnodes, node.node_rank or 0
    )
    shape = job_shape(draft, node.nnodes)
    first = None if node.node_rank is None else node.node_rank == 0
    silent_after = exec_opts.heartbeat_timeout
    with NodeStore.open(host, port, node.nnodes, node.rdzv_timeout, first, shape, silent_after) as store:
        if not store.host:
            check_shape(shape, store.served_shape(), store.endpoint)
        node_rank = store.arrive(node.node_rank)
        try:
            sink.notice(f"node {node_rank} of {node.nnodes}: waiting for the other nodes at {host_port(host, port)}")
            store.wait_all()
        except BaseException as exc:  # a timeout, Ctrl-C: while not every node has come, none has started
            if store.all_arrived():  # they came meanwhile: the others start, and must not wait for this one
                tell_others(store, node_rank, exc)
            else:
                store.withdraw(node_rank)
            raise
        try:
            if node_rank == 0:
                addr, mport = master_for_first_node(opts, host)
                store.publish_job(make_spec(opts).job_id, addr, mport)
            job_id, addr, mport = store.job()
        except BaseException as exc:  # every node arrived: the others start, and must not wait for this one
            tell_others(store, node_rank, exc)
            raise
        opts = opts.model_copy(update={"master_addr": addr, "master_port": str(mport)})
        plan = node_plan(opts, node.nnodes, node_rank, job_id, exec_opts.workdir, exec_opts.flight_recorder)
        watcher = FailureWatcher(store, silent_after)
        watcher.start()
        try:
            report = launch(plan, opts, exec_opts, sink, stop_request=watcher.stop_request)
        except BaseException as exc:
            # This node cannot run its part (its script is missing here, say): the other nodes' ranks must not
            # wait for its ranks until their collectives time out.
            tell_others(store, node_rank, exc)
            raise
        finally:
            watcher.stop()
        return settle(store, watcher, report, node_rank, sink, exec_opts.grace_period)

"""Per-node mode for real: several ``distlaunch run --nnodes`` processes on this machine form one job."""

import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from distlaunch.contract.endpoint import free_port
from tests.helpers import (
    children,
    distlaunch_cmd,
    finish,
    invoke,
    left_behind,
    on_fresh_ports,
    pids_with_env,
    wait_until,
)

SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = ["-m", "distlaunch.examples.allreduce"]


def node_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "NO_COLOR": "1", "COLUMNS": "120", **extra}


def start_node(*args: str, **env) -> subprocess.Popen:
    return subprocess.Popen(
        distlaunch_cmd("run", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_env(**env)
    )


def static_args(nnodes: int, node_rank: int, port: int, store: int, n: int = 2) -> list[str]:
    return [
        "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
        "--master-port", str(port), "--rdzv-endpoint", f"127.0.0.1:{store}", "-n", str(n),
    ]  # fmt: skip


def run_static(order: tuple[int, ...], *args: str, n: int = 2, **env) -> tuple[int, list[tuple[int, str, str]]]:
    """Start the nodes of a 2-node job with node ranks, in ``order``, and finish them: the master port and the
    results (again on new ports when another process took one of ours before node 0 bound it)."""

    def job():
        port, store = free_port(), free_port()
        procs = [start_node(*static_args(2, r, port, store, n), *args, **env) for r in order]
        return port, finish(procs, port_race=True)

    return on_fresh_ports(job)


def assert_quiet(results: list[tuple[int, str, str]]) -> None:
    """No node says it got a signal nobody sent it, and no thread of a node's launcher dies with a traceback or a
    C++ stack (its store client reading a store whose serving node left, that node's store server)."""
    for _, _, err in results[1:]:  # node 0 may have been signalled by the test itself
        assert "received SIGTERM" not in err and "interrupted by SIGTERM" not in err, err
    for _, _, err in results:
        assert "Exception in thread" not in err and "frame #" not in err, err


def sleepers_up(*args: str) -> list[subprocess.Popen]:
    """Two nodes of one rank each (ARGS end in fail_one.py, whose ranks sleep), once both ranks are up. A node
    that ends first fails the test with its output (or raises PortTaken on the port race)."""
    port, store = free_port(), free_port()
    procs = [start_node(*static_args(2, r, port, store, n=1), *args) for r in (0, 1)]
    for rank, proc in enumerate(procs):
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"node {rank} ended before its rank came up: {finish(procs, port_race=True)}")
        assert f"rank {rank} up" in line, line
    return procs


def test_two_nodes_with_node_ranks_form_one_allreduce_job():
    # Node 1 first: it must wait for node 0, which serves the nodes' store.
    _, results = run_static((1, 0), *ALLREDUCE)
    for code, _, err in results:
        assert code == 0, err
    lines = [line for _, out, _ in results for line in out.splitlines() if "all_reduce" in line]
    assert len([line for line in lines if "/4 (gloo): all_reduce(sum of rank+1) = 10 (ok)" in line]) == 4
    node1_out = results[0][1]
    assert "rank 2/4" in node1_out and "rank 3/4" in node1_out and "rank 0/4" not in node1_out


def test_every_rank_gets_its_global_rank_and_node_environment():
    port, results = run_static((0, 1), str(SCRIPTS / "env_dump.py"))
    envs = [
        json.loads(line.split("ENV ", 1)[1]) for _, out, _ in results for line in out.splitlines() if "ENV " in line
    ]
    by_rank = {int(e["RANK"]): e for e in envs}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, env in by_rank.items():
        assert env["WORLD_SIZE"] == "4" and env["NNODES"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == str(rank // 2)
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
    assert len({e["DISTLAUNCH_JOB_ID"] for e in envs}) == 1  # one job, not two


def test_rendezvous_gives_node_ranks_in_arrival_order():
    store = free_port()
    args = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{store}", "-n", "1", *ALLREDUCE]
    procs = []
    for i in range(2):
        procs.append(start_node(*args))
        # Wait until this node has checked in before starting the next one, so the order is known.
        line = procs[-1].stderr.readline()
        assert f"node {i} of 2" in line, line
    results = finish(procs)
    for i, (code, out, err) in enumerate(results):
        assert code == 0, err
        assert f"rank {i}/2 (gloo): all_reduce(sum of rank+1) = 3 (ok)" in out


def test_rendezvous_timeout_names_how_many_nodes_arrived():
    store = free_port()
    proc = start_node("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{store}", "--rdzv-timeout", "2", *ALLREDUCE)
    code, _, err = finish([proc])[0]
    assert code == 3
    assert f"node rendezvous at 127.0.0.1:{store} timed out after 2s: 1 of 2 nodes arrived" in err


def test_a_rank_failing_on_node_1_stops_node_0_with_its_exit_code():
    mark = uuid.uuid4().hex
    extra = ["--grace-period", "3", "--env", f"DLTEST_MARK={mark}", str(SCRIPTS / "fail_one.py")]
    _, results = run_static((0, 1), *extra, FAIL_RANK="3", FAIL_CODE="7", FAIL_AFTER="2")
    assert [code for code, _, _ in results] == [7, 7], [err for _, _, err in results]
    assert "rank 3 on node 1 failed with code 7; stopping all ranks" in results[0][2]  # said when it happens
    assert "stopped because rank 3 on node 1 failed with code 7" in results[0][2]
    assert "root cause" in results[0][2] and "node 1" in results[0][2]
    when = re.search(r"│ 3\s+│ node 1\s+│ 7\s+│ ([0-9.]+)s", results[0][2])  # when it failed, as node 1 saw it
    assert when and float(when.group(1)) >= 1.5, results[0][2]
    assert "rank 3 on localhost exited with code 7" in results[1][2]
    assert_quiet(results)
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", mark), timeout=10)


def test_a_node_whose_node_0_never_comes_waits_quietly_and_gives_up_after_the_timeout():
    store = free_port()  # nothing will serve it
    args = static_args(2, 1, free_port(), store, n=1)
    code, _, err = finish([start_node(*args, "--rdzv-timeout", "3", *ALLREDUCE)])[0]
    assert code == 3
    # one line, not a line (or a stack) for every try
    assert err.strip().splitlines() == [
        f"error: node rendezvous at 127.0.0.1:{store} not reachable within 3s: no node serves it "
        "(hint: start node 0 (or the first node on that host) and check the address and port)"
    ]


def test_dry_run_shows_this_nodes_part_of_the_plan():
    args = ["run", "--nnodes", "3", "--node_rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
    r = invoke([*args, "-n", "2", "--dry-run", "--json", "train.py"])
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["world_size"] == 6 and plan["nnodes"] == 3 and plan["master_addr"] == "10.0.0.1"
    assert [n["node_rank"] for n in plan["nodes"]] == [1]
    assert [rk["rank"] for rk in plan["nodes"][0]["ranks"]] == [2, 3]
    assert plan["nodes"][0]["ranks"][1]["env"]["NODE_RANK"] == "1"
    assert plan["groups"]["dp"] == [[0, 1, 2, 3, 4, 5]]


def test_bad_per_node_options_are_one_line_and_exit_2(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    cases = {
        ("--nnodes", "0"): "--nnodes 0 must be at least 1",
        (
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-addr",
            "h",
            "--master-port",
            "1",
        ): "--node-rank 2 is out of range",
        ("--nnodes", "2", "--node-rank", "0", "-H", str(hostfile)): "does not take -H",
        ("--nnodes", "2", "--node-rank", "1"): "--node-rank needs --master-addr",
        ("--nnodes", "2"): "--nnodes 2 needs --node-rank or --rdzv-endpoint",
        ("--nnodes", "2", "--rdzv_endpoint", "host"): "--rdzv-endpoint 'host' is not HOST:PORT",
    }
    for args, message in cases.items():
        r = invoke(["run", *args, "--dry-run", "train.py"])
        assert r.exit_code == 2, (args, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_every_node_names_the_rank_that_failed_first_on_any_node(tmp_path):
    # Rank 1 (node 1) crashes first, but its report comes a second late; rank 0 (node 0) fails 0.2 s after it.
    crashed = tmp_path / "crashed"
    script = ["--grace-period", "2", "--env", f"CRASHED_FILE={crashed}", str(SCRIPTS / "late_report.py")]
    _, results = run_static((0, 1), *script, n=1)
    assert [code for code, _, _ in results] == [42, 42], [err for _, _, err in results]
    node0_err = results[0][2]
    # "…, 0.401s before rank 0 here: it failed first (the root cause)" after its own rank failed, or (on a
    # machine so loaded that rank 0 takes over a second to fail) "stopped because …" when node 1 came first
    assert "rank 1 on node 1 failed with code 42" in node0_err, node0_err
    rows = [line for line in node0_err.splitlines() if line.startswith("│ ") and "│ " in line[2:]]
    assert rows[0].split("│")[2].strip() == "node 1", node0_err  # the first row of the root-cause table


def test_a_node_other_than_node_0_ends_strays_and_gathers_stacks_of_its_own_ranks(tmp_path):
    # Events that name a node (stray processes, stacks on a hang) on a node whose part of the plan is not node 0.
    _, results = run_static((0, 1), str(SCRIPTS / "straggler.py"), n=1)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "ended 1 stray process of this job on localhost" in results[1][2]
    napper = tmp_path / "napper.py"
    napper.write_text("import time\n\n\ndef nap():\n    time.sleep(120)\n\n\nnap()\n")
    _, results = run_static((0, 1), "--hang-timeout", "3", "--grace-period", "1", str(napper), n=1)
    assert [code for code, _, _ in results] == [124, 124], [err for _, _, err in results]
    assert "distlaunch: hang: rank 1 waits in nap (napper.py:5)" in results[1][2]


def test_a_frozen_agent_on_node_1_is_named_and_every_node_stops(tmp_path):
    mark = uuid.uuid4().hex
    args = [
        "--heartbeat-timeout",
        "3",
        "--grace-period",
        "1",
        "--env",
        f"DLTEST_MARK={mark}",
        str(SCRIPTS / "fail_one.py"),
    ]

    def job():
        procs = sleepers_up(*args)
        (agent,) = children(procs[1].pid)  # node 1's agent: SIGSTOP makes it a host that went silent
        os.kill(agent, signal.SIGSTOP)
        try:
            return finish(procs)
        finally:
            with contextlib.suppress(ProcessLookupError):  # a local agent given up is killed by its launcher
                os.kill(agent, signal.SIGCONT)

    results = on_fresh_ports(job)
    assert [code for code, _, _ in results] == [3, 3], [err for _, _, err in results]
    assert "localhost has been silent for" in results[1][2] and "--heartbeat-timeout 3" in results[1][2]
    assert "stopped because rank 1 on node 1 failed with code 3" in results[0][2]
    assert not (left := left_behind("DLTEST_MARK", mark, 15)), f"a rank outlived its frozen agent: {left}"


def test_a_node_that_cannot_run_its_part_stops_the_others(tmp_path):
    # The script is missing on node 1 only (no shared filesystem): node 1 refuses it after the rendezvous,
    # and node 0's ranks must not wait for node 1's ranks until their collectives time out.
    mark = uuid.uuid4().hex
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    (tmp_path / "node0" / "train.py").write_text((SCRIPTS / "fail_one.py").read_text())

    def job():
        port, store = free_port(), free_port()
        procs = [
            start_node(*static_args(2, r, port, store, n=1), "--grace-period", "1", "--env", f"DLTEST_MARK={mark}",
                       "--workdir", str(tmp_path / f"node{r}"), "train.py")
            for r in (0, 1)
        ]  # fmt: skip
        return finish(procs, timeout=60, port_race=True)

    results = on_fresh_ports(job)
    assert [code for code, _, _ in results] == [2, 2], [err for _, _, err in results]
    assert "train.py" in results[1][2]  # node 1's one line says what is missing where
    assert "stopped because node 1 ended with code 2, with no rank failing there" in results[0][2]
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", mark), timeout=10)


def test_stopping_one_node_stops_the_others():
    mark = uuid.uuid4().hex
    sleeper = ["--grace-period", "3", "--env", f"DLTEST_MARK={mark}", str(SCRIPTS / "fail_one.py")]

    def job():
        procs = sleepers_up(*sleeper)
        procs[0].send_signal(signal.SIGTERM)
        return finish(procs)

    results = on_fresh_ports(job)
    assert [code for code, _, _ in results] == [143, 143], [err for _, _, err in results]
    assert "node 0 ended with code 143, with no rank failing there; stopping all ranks" in results[1][2]
    assert "stopped because node 0 ended with code 143, with no rank failing there" in results[1][2]
    assert "finished" not in results[1][2]
    assert_quiet(results)
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", mark), timeout=10)


@pytest.mark.parametrize("killed", [1, 0])
def test_a_node_whose_launcher_is_killed_outright_stops_the_others_as_gone_silent(killed):
    """SIGKILL: the launcher says nothing to anyone (its agent takes its ranks with it). The other node stops its
    ranks within --heartbeat-timeout and exits 3, as for a silent host; when the killed one served the
    rendezvous, at once. The serving node does not wait --rdzv-timeout (300 s) for the dead one to finish."""
    mark = uuid.uuid4().hex
    sleeper = ["--grace-period", "1", "--heartbeat-timeout", "3", "--env", f"DLTEST_MARK={mark}"]

    def job():
        procs = sleepers_up(*sleeper, str(SCRIPTS / "fail_one.py"))
        procs[killed].kill()
        return finish(procs, timeout=60)

    results = on_fresh_ports(job)
    code, _, err = results[1 - killed]
    assert code == 3, err
    if killed == 1:
        assert "node 1 went silent: no heartbeat at the rendezvous for 3s (--heartbeat-timeout)" in err, err
    else:
        assert re.search(r"the node serving the rendezvous at 127\.0\.0\.1:\d+ is gone", err), err
    assert_quiet([(0, "", ""), (code, "", err)])
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", mark), timeout=10)


def test_a_serving_node_whose_launcher_hangs_stops_the_others_and_ends_itself_once_it_wakes():
    """SIGSTOP on node 0's launcher (its ranks run on): a host that hangs, or one cut off while its connections
    stay open. A store client that waits for an answer for good (torch's did) hangs node 1 until killed; node 1
    stops its ranks within --heartbeat-timeout and exits 3. A node that arrives meanwhile (the port still
    accepts: the kernel does that) gives up once --rdzv-timeout and --heartbeat-timeout have passed. Woken, node 0 finds it was given up and ends its own ranks. (A hung node 1
    stops beating: the case of a node killed outright, above.)"""
    mark = uuid.uuid4().hex
    sleeper = ["--grace-period", "1", "--heartbeat-timeout", "3", "--env", f"DLTEST_MARK={mark}"]

    def job():
        node0, node1 = sleepers_up(*sleeper, str(SCRIPTS / "fail_one.py"))
        os.kill(node0.pid, signal.SIGSTOP)
        try:
            (result1,) = finish([node1], timeout=60)
            store = re.search(r"rendezvous at (127\.0\.0\.1:\d+)", result1[2])
            assert store, result1[2]
            late = start_node("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                              str(free_port()), "--rdzv-endpoint", store.group(1), "--rdzv-timeout", "2",
                              "--heartbeat-timeout", "2", "-n", "1", *ALLREDUCE)  # fmt: skip
            (arrived,) = finish([late], timeout=60)
        finally:
            os.kill(node0.pid, signal.SIGCONT)
        return [*finish([node0], timeout=60), result1, arrived]

    results = on_fresh_ports(job)
    code, _, err = results[1]
    assert code == 3, err
    assert re.search(r"the node serving the rendezvous at 127\.0\.0\.1:\d+ has not answered for 3s", err), err
    late_code, _, late_err = results[2]
    assert late_code == 3, late_err
    assert re.search(r"the node serving the rendezvous at 127\.0\.0\.1:\d+ has not answered for \d+s", late_err)
    assert "Traceback" not in late_err and "Exception in thread" not in late_err, late_err
    woken_code, _, woken_err = results[0]
    assert woken_code == 3, woken_err  # its own watcher or its agent saw the launcher away, whichever came first
    assert "launcher did not run for" in woken_err or "heard nothing from this launcher" in woken_err, woken_err
    assert_quiet([(0, "", ""), (code, "", err)])
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", mark), timeout=10)


def test_a_refused_or_withdrawn_node_does_not_count_and_the_job_forms_when_the_right_ones_come():
    """nnodes 3: a second --node-rank 1 is refused and takes its arrival back (counted, nodes 0 and 1 started
    without node 2 and hung); node 1 interrupted while it waits withdraws, and comes again with its rank."""

    def job():
        port, store = free_port(), free_port()
        first = [start_node(*static_args(3, r, port, store, n=1), *ALLREDUCE) for r in (0, 1)]
        # the duplicate comes once node 1 has arrived: whichever of the two arrives second is the one refused
        assert wait_until(lambda: "waiting for the other nodes" in first[1].stderr.readline(), timeout=60)
        dup = start_node(*static_args(3, 1, port, store, n=1), *ALLREDUCE)
        code, _, err = finish([dup])[0]
        assert code == 2 and "--node-rank 1 was given to two nodes" in err, err
        first[1].send_signal(signal.SIGINT)  # node 1 leaves while it waits: withdrawn, it may come back
        # gone before the others come (on a loaded machine node 2 arrived while node 1 still handled its
        # Ctrl-C: the job had formed, so node 1 rightly stopped it)
        (withdrawn,) = finish([first[1]])
        again = [start_node(*static_args(3, r, port, store, n=1), *ALLREDUCE) for r in (1, 2)]
        results = finish([first[0], *again], port_race=True)
        return [results[0], withdrawn, *results[1:]]

    results = on_fresh_ports(job)
    assert results[1][0] == 130, results[1][2]
    names = ("node 0", "node 1 (withdrawn)", "node 1", "node 2")
    every = "\n".join(f"{name}: exit {code}\n{err}" for name, (code, _, err) in zip(names, results, strict=True))
    for code, _, _ in (results[0], *results[2:]):
        assert code == 0, every  # every node's side: which one stopped the job, and why
    out = "".join(o for _, o, _ in results)
    assert sum("all_reduce(sum of rank+1) = 6 (ok)" in line for line in out.splitlines()) == 3, out


def test_a_node_that_starts_another_job_is_refused_before_it_counts():
    """-n 1 where node 0 has -n 2: its ranks would take numbers and groups node 0's do not expect, and every rank
    would hang in its first collective. It is refused in one line, uncounted, and the right node 1 completes
    the job."""

    def job():
        port, store = free_port(), free_port()
        first = start_node(*static_args(2, 0, port, store, n=2), *ALLREDUCE)
        assert wait_until(lambda: "waiting for the other nodes" in first.stderr.readline(), timeout=60)
        odd = start_node(*static_args(2, 1, port, store, n=1), *ALLREDUCE)
        code, _, err = finish([odd])[0]
        assert code == 2, err
        assert "this node starts another job than the node serving the rendezvous at 127.0.0.1:" in err, err
        assert "-n 1 here, 2 there; --parallel dp=2,tp=1,pp=1,zero=0 here, dp=4,tp=1,pp=1,zero=0 there" in err, err
        assert "start every node with the same --nnodes, -n, --parallel, --backend" in err, err
        right = start_node(*static_args(2, 1, port, store, n=2), *ALLREDUCE)
        return finish([first, right], port_race=True)

    results = on_fresh_ports(job)
    for code, _, err in results:
        assert code == 0, err
    out = "".join(o for _, o, _ in results)
    assert sum("/4 (gloo): all_reduce(sum of rank+1) = 10 (ok)" in line for line in out.splitlines()) == 4, out

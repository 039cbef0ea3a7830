"""Network cards for real: ``nsnode`` is an sshd in a network namespace of its own with two cards, the veth to this
machine (the only one that reaches the master) and a second pair of its own (nic0, nic1, 10.98.0.0/24). Its ranks
get GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME of the right one, on every launch path: a job's host, a spare that
joins a job, an srun task in that namespace; a user's value wins, and is said when it misses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures.netns import need_root_netns, netns_sshd

from tests.doctor.conftest import host_block, write_config
from tests.fixtures import require
from tests.helpers import distlaunch_cmd
from tests.remote.test_multihost import cli_env
from tests.slurm.test_slurm_env import task_env

CHECKOUT = str(Path(__file__).resolve().parents[2])  # the task imports this distlaunch in the namespace too
ENV_DUMP = (
    "import json, os\n"
    "names = ('GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME')\n"
    "print('NICS ' + json.dumps([os.environ['RANK'], *(os.environ.get(n) for n in names)]), flush=True)\n"
)


@pytest.fixture(scope="module")
def two_cards(tmp_path_factory):
    require(need_root_netns())
    with netns_sshd(tmp_path_factory.mktemp("netcards-sshd"), "dlnic") as host:
        host.ns("ip", "link", "add", "nic0", "type", "veth", "peer", "name", "nic1")
        for name, address in (("nic0", "10.98.0.1/24"), ("nic1", "10.98.0.2/24")):
            host.ns("ip", "addr", "add", address, "dev", name)
            host.ns("ip", "link", "set", name, "up")
        yield host


def launch(host, tmp_path, hostfile: str, *args: str, extra: str = "") -> subprocess.CompletedProcess:
    ns = host.cluster
    config = write_config(
        tmp_path / "ssh_config", ns, host_block("nsnode", host.address, ns.port, ns.user_key, ns.known_hosts) + extra
    )
    (tmp_path / "hosts").write_text(hostfile, encoding="utf-8")
    (tmp_path / "nics.py").write_text(ENV_DUMP, encoding="utf-8")
    argv = distlaunch_cmd("run", "-H", str(tmp_path / "hosts"), "--ssh-config", str(config), *args, "nics.py")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=cli_env(), cwd=tmp_path)


def cards(out: str) -> dict[int, list[str | None]]:
    rows = [json.loads(line.split("NICS ", 1)[1]) for line in out.splitlines() if "NICS " in line]
    return {int(rank): names for rank, *names in rows}


def test_each_host_gets_its_card_toward_the_master(two_cards, tmp_path):
    """localhost is rank 0's host, so the master is this machine's end of the veth: nsnode reaches it through its
    own end only, and this machine (its own card and the veth) through the veth."""
    done = launch(two_cards, tmp_path, "localhost slots=1\nnsnode slots=1\n")
    assert done.returncode == 0, done.stderr
    assert cards(done.stdout + done.stderr) == {0: [two_cards.outside] * 2, 1: [two_cards.inside] * 2}
    master = two_cards.address.rsplit(".", 1)[0] + ".1"
    said = f"network: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME={two_cards.inside} on nsnode (reaches {master})"
    assert said in done.stderr, done.stderr


def test_the_users_card_wins_and_one_that_misses_the_master_is_said(two_cards, tmp_path):
    done = launch(two_cards, tmp_path, "nsnode slots=1\n", "--env", "GLOO_SOCKET_IFNAME=nic0")
    assert done.returncode == 0, done.stderr
    assert cards(done.stdout + done.stderr) == {0: ["nic0", two_cards.inside]}
    said = f"network: GLOO_SOCKET_IFNAME=nic0 (yours, kept) does not reach the master from nsnode ({two_cards.inside} does)"
    assert said in done.stderr, done.stderr


def test_a_card_a_host_does_not_have_is_one_line_and_exit_2(two_cards, tmp_path):
    done = launch(two_cards, tmp_path, "nsnode slots=1\n", "--env", "NCCL_SOCKET_IFNAME==eth7")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "NCCL_SOCKET_IFNAME==eth7 names no interface of nsnode" in errors[0], done.stderr
    assert "NICS" not in done.stdout + done.stderr


def test_a_spare_that_joins_chooses_its_card_as_any_host_does(two_cards, tmp_path):
    """--nnodes 2:2 over localhost, nolisten (nothing answers there: it fails the preflight) and nsnode, the spare
    that takes its place: its rank gets its card toward the master."""
    ns = two_cards.cluster
    nolisten = host_block("nolisten", "127.0.0.99", ns.port, ns.user_key, ns.known_hosts)
    hostfile = "localhost slots=1\nnolisten slots=1\nnsnode slots=1\n"
    done = launch(two_cards, tmp_path, hostfile, "--nnodes", "2:2", extra=nolisten)
    assert done.returncode == 0, done.stderr
    assert "preflight: nolisten" in done.stderr, done.stderr
    assert cards(done.stdout + done.stderr) == {0: [two_cards.outside] * 2, 1: [two_cards.inside] * 2}
    assert f"NCCL_SOCKET_IFNAME={two_cards.inside} on nsnode" in done.stderr, done.stderr


def srun_task(host, tmp_path, **extra: str) -> subprocess.CompletedProcess:
    """``distlaunch run nics.py`` as local task 0 of gpu08, the second node of an srun step, in nsnode's namespace;
    the master is this machine's end of the veth."""
    (tmp_path / "nics.py").write_text(ENV_DUMP, encoding="utf-8")
    master = host.address.rsplit(".", 1)[0] + ".1"
    env = {**cli_env(), **task_env(2, 1, 0), "MASTER_ADDR": master, "PYTHONPATH": CHECKOUT, **extra}
    argv = ["ip", "netns", "exec", host.name, *distlaunch_cmd("run", "nics.py")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


def test_an_srun_task_chooses_its_hosts_card_and_keeps_the_users(two_cards, tmp_path):
    done = srun_task(two_cards, tmp_path)
    assert done.returncode == 0, done.stderr
    assert cards(done.stdout) == {2: [two_cards.inside] * 2}
    master = two_cards.address.rsplit(".", 1)[0] + ".1"
    said = f"distlaunch: network: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME={two_cards.inside} on gpu08 (reaches {master})"
    assert said in done.stderr, done.stderr
    done = srun_task(two_cards, tmp_path, GLOO_SOCKET_IFNAME="nic0")
    assert cards(done.stdout) == {2: ["nic0", two_cards.inside]}
    assert "GLOO_SOCKET_IFNAME=nic0 (yours, kept) does not reach the master from gpu08" in done.stderr, done.stderr

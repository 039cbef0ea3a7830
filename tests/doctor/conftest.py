"""Doctor test helpers: run the real CLI in-process and index its JSON report; extra ssh_config hosts that
fail in one specific way each; a network namespace with its own sshd, firewall and /etc/hosts."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.sshd import SshdCluster, start_sshd
from helpers import invoke


@dataclass
class DoctorRun:
    exit_code: int
    report: dict
    stderr: str

    def get(self, id: str, host: str) -> dict:
        """The one check with this id on this host."""
        found = [c for c in self.report["checks"] if c["id"] == id and c["host"] == host]
        assert len(found) == 1, f"{id}@{host}: {len(found)} checks in {json.dumps(self.report, indent=1)}"
        return found[0]

    def status(self, id: str, host: str) -> str:
        return self.get(id, host)["status"]

    def of_host(self, host: str) -> list[dict]:
        return [c for c in self.report["checks"] if c["host"] == host]


def doctor(*args: str, env: dict[str, str] | None = None) -> DoctorRun:
    """``distlaunch doctor ARGS --json`` in-process."""
    result = invoke(["doctor", *args, "--json"], env=env)
    assert result.stdout.strip(), f"no JSON (exit {result.exit_code}): {result.stderr}"
    return DoctorRun(result.exit_code, json.loads(result.stdout), result.stderr)


def free_port() -> int:
    """A port free on the test cluster's addresses."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.11", 0))
        return s.getsockname()[1]


def assert_healthy(run: DoctorRun, host: str, local: bool = False) -> None:
    """No false alarms: every check of a healthy host passes (skips only where a check does not apply:
    NCCL without GPUs, SSH on this machine)."""
    bad = [c for c in run.of_host(host) if c["status"] not in ("pass", "skip")]
    assert not bad, f"false alarms on {host}: {bad}"
    skipped = {c["id"] for c in run.of_host(host) if c["status"] == "skip"}
    allowed = {"nccl"} | ({"ssh.connect", "ssh.auth", "ssh.hostkey"} if local else set())
    assert skipped <= allowed, f"unexpected skips on {host}: {skipped}"


def write_config(path: Path, cluster: SshdCluster, extra: str) -> Path:
    """The cluster's ssh_config plus ``extra`` Host blocks."""
    path.write_text(cluster.ssh_config.read_text(encoding="utf-8") + "\n" + extra, encoding="utf-8")
    return path


def host_block(alias: str, hostname: str, port: int, identity: Path, known_hosts: Path) -> str:
    return (
        f"Host {alias}\n  HostName {hostname}\n  Port {port}\n  IdentityFile {identity}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  ConnectTimeout 3\n"
    )


def need_root_netns() -> str | None:
    """Why a network namespace cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install -y iproute2 iptables)"
    probe = f"dlprobe{os.getpid() % 10000}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"the kernel refuses network namespaces: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class NetnsHost:
    """An sshd inside a private network namespace, reached from here over a veth pair."""

    name: str
    outside: str  # the veth end here
    inside: str  # the veth end in the namespace
    address: str  # the namespace's address (10.99.N.2)
    cluster: SshdCluster
    hosts_file: Path  # /etc/netns/NAME/hosts: the namespace's /etc/hosts (ip netns exec bind-mounts it)

    def ns(self, *argv: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, *argv], check=True, capture_output=True)

    def set_hosts(self, text: str) -> None:
        """Rewrite the namespace's /etc/hosts in place (the same inode stays bind-mounted for running sshd)."""
        with open(self.hosts_file, "r+", encoding="utf-8") as f:
            f.truncate(0)
            f.write(text)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def netns_host(tmp_path_factory):
    """A namespace with lo, a veth to this side (10.99.N.1 here, 10.99.N.2 there) and its own sshd."""
    reason = need_root_netns()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}", pytrace=False)
        pytest.skip(reason)
    tag = f"{os.getpid() % 1000}{random.randrange(100)}"
    name, outside, inside, net = f"dldoc{tag}", f"dld{tag}a", f"dld{tag}b", f"10.99.{random.randrange(1, 254)}"
    hosts_dir = Path("/etc/netns") / name
    cluster = None
    try:
        _sh("ip", "netns", "add", name)
        hosts_dir.mkdir(parents=True)
        (hosts_dir / "hosts").write_text("127.0.0.1 localhost\n", encoding="utf-8")
        _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _sh("ip", "link", "set", inside, "netns", name)
        _sh("ip", "addr", "add", f"{net}.1/24", "dev", outside)
        _sh("ip", "link", "set", outside, "up")
        for argv in (
            ["ip", "addr", "add", f"{net}.2/24", "dev", inside],
            ["ip", "link", "set", inside, "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _sh("ip", "netns", "exec", name, *argv)
        cluster = start_sshd(
            tmp_path_factory.mktemp("netns-sshd"), addresses=[f"{net}.2"], prefix=("ip", "netns", "exec", name)
        )
        yield NetnsHost(name, outside, inside, f"{net}.2", cluster, hosts_dir / "hosts")
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", outside], capture_output=True)  # gVisor keeps the peer otherwise
        shutil.rmtree(hosts_dir, ignore_errors=True)

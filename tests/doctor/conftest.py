"""Doctor test helpers: run the real CLI in-process and index its JSON report; extra ssh_config hosts that
fail in one specific way each; a network namespace with its own sshd, firewall and /etc/hosts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.netns import need_root_netns, netns_sshd
from fixtures.sshd import SshdCluster
from helpers import invoke

from distlaunch.contract import endpoint
from tests.fixtures import require


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
    return endpoint.free_port("127.0.0.11")


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


@pytest.fixture(scope="module")
def netns_host(tmp_path_factory):
    """A namespace with lo, a veth to this side (10.99.N.1 here, 10.99.N.2 there) and its own sshd."""
    reason = need_root_netns()
    require(reason)
    with netns_sshd(tmp_path_factory.mktemp("netns-sshd"), "dldoc") as host:
        yield host

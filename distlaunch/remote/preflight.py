"""The preflight of a launch's remote hosts, over the transport of this machine: OpenSSH clients
(``fanout.OpensshHosts``) where ``ssh`` is installed, else paramiko (``session.ParamikoHosts``); see
openssh.transport. It sits above both, so that neither transport imports the other."""

from __future__ import annotations

from pathlib import Path

from distlaunch.remote.agent_conn import hello_timeout
from distlaunch.remote.fanout import OpensshHosts
from distlaunch.remote.openssh import transport
from distlaunch.remote.session import HostSettings, ParamikoHosts, RemoteHosts
from distlaunch.remote.sshconfig import resolve_targets


def preflight(
    aliases: list[str],
    *,
    ssh_config: Path | str | None,
    accept_new_host_keys: bool,
    python: str,
    workdir: str,
    job_id: str = "",
    timeout: float | None = None,
) -> RemoteHosts:
    """Connect to every host and start its agent, each waiting for its node plan; raise HostsFailed (exit 3)
    naming every bad host."""
    kind = OpensshHosts if transport() == "openssh" else ParamikoHosts
    start_timeout = hello_timeout()  # a bad value is told before any host is reached
    targets = resolve_targets(aliases, ssh_config)
    hosts = kind.connect(targets, HostSettings(ssh_config, accept_new_host_keys, python, workdir, job_id, timeout))
    try:
        hosts.start_agents(start_timeout)
    except BaseException:
        hosts.close()
        raise
    return hosts

"""``RemoteHosts``: the SSH side of one launch. Preflight first (connect to every remote host in
parallel and check that its Python can run the agent), so an unreachable or unprepared host fails the
launch with exit 3 before any rank starts anywhere; then one agent channel per node; closed in finally."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from distlaunch.errors import HostError
from distlaunch.remote.agent_conn import SshAgent
from distlaunch.remote.command import run_command
from distlaunch.remote.ssh import MAX_PARALLEL, HostsFailed, SshClient, SshError, close_all, connect_all, require_all
from distlaunch.remote.sshconfig import resolve_targets

CHECK_TIMEOUT_S = 30.0
# Run by the remote Python without a shell: can it start the agent in the working directory?
_AGENT_CHECK = ("import os, sys\n"
                "try:\n    os.chdir(sys.argv[1])\nexcept OSError as e:\n    sys.exit('distlaunch-workdir: %s' % e.strerror)\n"
                "sys.path.insert(0, '')\n"  # as `python -m` does: a checkout in the workdir is importable
                "import distlaunch.agent\n")


class RemoteHosts:
    """Open, checked SSH connections to the remote hosts of a job; hands out one agent per node."""

    def __init__(self, clients: dict[str, SshClient], python: str, workdir: str):
        self.clients, self.python, self.workdir = clients, python, workdir

    @classmethod
    def open(cls, aliases: list[str], *, ssh_config: Path | str | None, accept_new_host_keys: bool, python: str,
             workdir: str, timeout: float | None = None) -> "RemoteHosts":
        """Connect to every host and check its agent can start; raise HostsFailed (exit 3) naming every bad host."""
        targets = resolve_targets(aliases, ssh_config)
        results = connect_all(targets, timeout=timeout, accept_new_host_keys=accept_new_host_keys)
        hosts = cls(require_all(results, "could not be reached; no rank was started"), python, workdir)
        try:
            hosts.check_agents()
        except BaseException:
            hosts.close()
            raise
        return hosts

    def check_agents(self) -> None:
        """Every host can run ``python -m distlaunch.agent`` in the working directory, or HostsFailed."""
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(self.clients)) or 1) as pool:
            found = list(pool.map(self._check_one, self.clients))
        errors = [e for e in found if e is not None]
        if errors:
            raise HostsFailed(errors, "cannot start the distlaunch agent; no rank was started")

    def _check_one(self, alias: str) -> HostError | None:
        try:
            result = run_command(self.clients[alias], [self.python, "-c", _AGENT_CHECK, self.workdir], timeout=CHECK_TIMEOUT_S)
        except SshError as exc:
            return exc
        if result.rc == 0:
            return None
        last = (result.stderr.strip().splitlines() or [f"exit code {result.rc}"])[-1]
        if result.rc == 127:
            return HostError(f"{alias}: Python {self.python!r} not found ({last})",
                             f"install Python there, or pass --remote-python PATH (an interpreter with distlaunch installed)")
        if last.startswith("distlaunch-workdir:"):
            return HostError(f"{alias}: working directory {self.workdir!r} is not usable:{last.partition(':')[2]}",
                             f"create it on {alias} (the same checkout as here), or pass --workdir DIR")
        if "No module named" in last:
            return HostError(f"{alias}: {self.python} cannot import distlaunch ({last})",
                             f"install distlaunch for that Python on {alias} (pip install distlaunch), or pass --remote-python / --workdir")
        return HostError(f"{alias}: {self.python} -m distlaunch.agent cannot start: {last}",
                         f"run it by hand to see why: ssh {alias} {self.python} -m distlaunch.agent")

    def agent(self, node_rank: int, host: str, events) -> SshAgent:
        """A not yet started agent connection for the node on ``host``."""
        return SshAgent(node_rank, host, events, self.clients[host], self.python, self.workdir)

    def close(self) -> None:
        """Disconnect from every host."""
        close_all(self.clients)

    def __enter__(self) -> "RemoteHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

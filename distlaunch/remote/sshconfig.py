"""OpenSSH client configuration → ``SshTarget``: what to connect to for a hostfile name, resolved the
way ``ssh`` itself would (Host aliases, HostName, Port, User, IdentityFile, IdentitiesOnly,
UserKnownHostsFile, StrictHostKeyChecking, HostKeyAlias, ConnectTimeout, ProxyJump, ProxyCommand)."""

from __future__ import annotations

import functools
import getpass
import heapq
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import paramiko
from pydantic import BaseModel, Field

from distlaunch.contract.hostname import host_port
from distlaunch.errors import UsageError
from distlaunch.files import os_error_words, read_settings

DEFAULT_CONFIG = "~/.ssh/config"
# As OpenSSH: without an IdentityFile, these are tried (the ones that exist).
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_JUMPS = 8  # a ProxyJump chain longer than this is a loop in the config
MATCH_EXEC_TIMEOUT_S = 10.0  # a config's `Match exec` command that runs longer is an error, not a silent hang


class _BoundedMatchExec:
    """What paramiko runs a config's ``Match exec`` command with (its module's ``invoke``), with a time limit.

    paramiko sets none, as OpenSSH: a command that hangs (a probe of a gateway that is down, say) would leave
    every launch and doctor run waiting in silence. Past the limit the command is killed and the launch
    stops with one line that names it."""

    def __init__(self, invoke):
        self.invoke = invoke

    def run(self, command: str, **kwargs):
        try:
            # in_stream=False: the command never reads this process's stdin (a pipe, a closed one, a terminal)
            return self.invoke.run(command, timeout=MATCH_EXEC_TIMEOUT_S, in_stream=False, **kwargs)
        except self.invoke.exceptions.CommandTimedOut:
            raise UsageError(
                f"ssh config: Match exec {command!r} did not finish within {MATCH_EXEC_TIMEOUT_S:g}s",
                "fix or remove that Match exec (OpenSSH runs it too, before every connection)",
            ) from None


if paramiko.config.invoke is not None:  # without invoke, paramiko refuses Match exec itself
    paramiko.config.invoke = _BoundedMatchExec(paramiko.config.invoke)


class SshTarget(BaseModel):
    """One host as SSH reaches it, after ssh_config."""

    alias: str  # the name in the hostfile (maybe an ssh_config Host alias)
    hostname: str  # the real name or address (HostName); what other hosts use to reach it
    port: int = 22
    user: str
    identity_files: list[str] = Field(default_factory=list)  # existing private key files, in order
    identities_only: bool = False  # True: only identity_files, not the keys of a running ssh-agent
    known_hosts_files: list[str] = Field(default_factory=list)  # the first one receives accepted new keys
    global_known_hosts_files: list[str] = Field(default_factory=list)
    strict_host_key_checking: Literal["yes", "accept-new", "no"] = "yes"  # "ask" counts as yes: nobody to ask
    host_key_alias: str | None = None
    connect_timeout: float | None = None
    proxy_command: str | None = None
    jumps: list[SshTarget] = Field(default_factory=list)  # ProxyJump hops, first hop first
    config_file: str | None = None  # where these settings came from, for hints

    @property
    def endpoint(self) -> str:
        """``host:port`` as it appears in messages."""
        return host_port(self.hostname, self.port)

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts (``[host]:port`` off port 22)."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"


@functools.lru_cache(maxsize=8)
def _parse(file: str, mtime_ns: int, size: int) -> paramiko.SSHConfig:
    """One parse per file version and process: planning and connecting read the same config."""
    return paramiko.SSHConfig.from_text(read_settings(file))  # at most 64 MiB: /dev/zero is not read for ever


_WILDCARDS = frozenset("*?[!")


@functools.lru_cache(maxsize=8)
def _blocks_by_name(config: paramiko.SSHConfig) -> tuple[list[int], dict[str, list[int]]] | None:
    """The config's blocks that may apply to any name (``Host`` patterns with wildcards or negations, ``Match``),
    and those that apply to one literal name only, by that name; None where that cannot be told (a config that
    canonicalizes host names looks them up twice, the second time by another name).

    paramiko's lookup tries every block of the file for every name, so resolving a hostfile against an
    ssh_config with a block per host grows with the square of the hosts: 16 s for 1,024 hosts. With this, each
    lookup reads the general blocks and its own."""
    blocks = getattr(config, "_config", None)
    if not isinstance(blocks, list) or any("canonicalizehostname" in b.get("config", {}) for b in blocks):
        return None
    general: list[int] = []
    by_name: dict[str, list[int]] = {}
    for i, block in enumerate(blocks):
        names = block.get("host")
        if "matches" in block or not names or any(_WILDCARDS & set(name) for name in names):
            general.append(i)
            continue
        for name in set(names):
            by_name.setdefault(name, []).append(i)
    return general, by_name


@functools.lru_cache(maxsize=8192)
def _lookup(config: paramiko.SSHConfig, alias: str) -> paramiko.SSHConfigDict:
    """``config.lookup(alias)``, reading only the blocks that may apply, once per config and name (planning and
    connecting both resolve every host). Callers only read what it returns."""
    index = _blocks_by_name(config)
    if index is None:
        return config.lookup(alias)
    general, by_name = index
    subset = paramiko.SSHConfig()
    subset._config = [config._config[i] for i in heapq.merge(general, by_name.get(alias, ()))]
    return subset.lookup(alias)


def load_ssh_config(path: Path | str | None = None) -> tuple[paramiko.SSHConfig, str | None]:
    """Parse ``path`` (or ``~/.ssh/config`` if it exists); returns the config and the file it came from."""
    explicit = path is not None
    file = Path(os.path.expanduser(str(path if explicit else DEFAULT_CONFIG)))
    if not file.exists():
        if explicit:
            raise UsageError(f"ssh config {str(path)!r} does not exist", "check the path given to --ssh-config")
        return paramiko.SSHConfig(), None
    try:
        stat = file.stat()
        return _parse(str(file), stat.st_mtime_ns, stat.st_size), str(file)
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError) as exc:
        raise UsageError(
            f"ssh config {str(file)!r} cannot be read: {os_error_words(exc)}",
            "fix the file (ssh -G HOST -F FILE shows how OpenSSH reads it)",
        ) from None


def _expand(value: str, target: SshTarget) -> str:
    """OpenSSH's %-tokens and ~ for file names paramiko leaves unexpanded (UserKnownHostsFile)."""
    tokens = {
        "%%": "%",
        "%d": os.path.expanduser("~"),
        "%h": target.hostname,
        "%n": target.alias,
        "%p": str(target.port),
        "%r": target.user,
        "%u": getpass.getuser(),
    }
    for token, replacement in tokens.items():
        value = value.replace(token, replacement)
    return os.path.expanduser(value)


def _files(value: str | list[str] | None, defaults: Iterable[str], target: SshTarget) -> list[str]:
    if value is None:
        return [os.path.expanduser(f) for f in defaults]
    words = value if isinstance(value, list) else value.split()
    if [w.lower() for w in words] == ["none"]:
        return []
    return [_expand(w, target) for w in words]


def _strictness(value: str | None) -> Literal["yes", "accept-new", "no"]:
    value = (value or "yes").lower()
    if value in ("no", "off"):
        return "no"
    return "accept-new" if value == "accept-new" else "yes"


def _split_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` → (user, host, port)."""
    spec = spec.removeprefix("ssh://")
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6addr]:port
        host, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":") or None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    try:
        return user or None, host, int(port) if port else None
    except ValueError:
        raise UsageError(f"ProxyJump {spec!r} has a bad port", "write ProxyJump [user@]host[:port]") from None


def resolve_target(alias: str, config: paramiko.SSHConfig, config_file: str | None = None, depth: int = 0) -> SshTarget:
    """Resolve one hostfile name through ssh_config into an SshTarget."""
    found = _lookup(config, alias)
    try:
        port = int(found.get("port", 22))
        timeout = float(found["connecttimeout"]) if "connecttimeout" in found else None
    except ValueError as exc:
        raise UsageError(
            f"ssh config for {alias!r} has a bad number: {exc}", f"fix Port/ConnectTimeout for {alias} in {config_file}"
        ) from None
    target = SshTarget(
        alias=alias,
        hostname=found.get("hostname", alias),
        port=port,
        user=found.get("user") or getpass.getuser(),
        identities_only=found.get("identitiesonly", "no").lower() == "yes",
        strict_host_key_checking=_strictness(found.get("stricthostkeychecking")),
        host_key_alias=found.get("hostkeyalias"),
        connect_timeout=timeout,
        config_file=config_file,
    )
    target.identity_files = [
        f for f in _files(found.get("identityfile"), DEFAULT_IDENTITIES, target) if os.path.isfile(f)
    ]
    target.known_hosts_files = _files(found.get("userknownhostsfile"), DEFAULT_KNOWN_HOSTS, target)
    target.global_known_hosts_files = _files(found.get("globalknownhostsfile"), GLOBAL_KNOWN_HOSTS, target)
    proxy_command = found.get("proxycommand")
    target.proxy_command = None if proxy_command is None or proxy_command.lower() == "none" else proxy_command
    jump = found.get("proxyjump", "none")
    if jump.lower() != "none" and target.proxy_command is None:
        target.jumps = _resolve_jumps(alias, jump, config, config_file, depth)
    return target


def _resolve_jumps(
    alias: str, jump: str, config: paramiko.SSHConfig, config_file: str | None, depth: int
) -> list[SshTarget]:
    if depth >= MAX_JUMPS:
        raise UsageError(
            f"ProxyJump chain for {alias!r} is longer than {MAX_JUMPS} hops",
            f"look for a ProxyJump loop in {config_file}",
        )
    hops = []
    for spec in jump.split(","):
        user, host, port = _split_jump(spec.strip())
        hop = resolve_target(host, config, config_file, depth + 1)
        # A hop's own ProxyJump comes first (OpenSSH does the same), then the hop itself.
        hops += hop.jumps
        hops.append(
            hop.model_copy(update={"jumps": [], **({"user": user} if user else {}), **({"port": port} if port else {})})
        )
    return hops


def resolve_targets(aliases: Iterable[str], ssh_config: Path | str | None = None) -> dict[str, SshTarget]:
    """Resolve every hostfile name through ``ssh_config`` (default ``~/.ssh/config``), in order."""
    config, config_file = load_ssh_config(ssh_config)
    return {alias: resolve_target(alias, config, config_file) for alias in aliases}

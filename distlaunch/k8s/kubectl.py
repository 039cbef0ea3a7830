"""Running kubectl: the one place that finds it, names the command that failed, and reads its JSON.

A missing kubectl is bad input here (exit 2); a kubectl that fails (cluster unreachable, no access) is a
host that cannot be reached (exit 3). Either way: one line naming the kubectl command, never a traceback.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

from distlaunch.errors import HostError, UsageError

TIMEOUT_S = 60.0
NOT_FOUND = "(NotFound)"  # how the API server's 404 reads in kubectl's stderr


class NotFound(HostError):
    """kubectl answered that the object does not exist."""


def kubectl_path(args: list[str]) -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise UsageError(
            f"cannot run '{command_line(args)}': kubectl is not on PATH",
            "install kubectl (with access to the cluster), or run distlaunch where it is",
        )
    return found


def command_line(args: list[str]) -> str:
    return shlex.join(["kubectl", *args])


def with_namespace(args: list[str], namespace: str | None) -> list[str]:
    return [*args, "-n", namespace] if namespace else args


def kubectl(args: list[str], timeout: float = TIMEOUT_S) -> str:
    """kubectl's stdout for ``args``; raises (NotFound or HostError) with kubectl's first line of complaint."""
    path = kubectl_path(args)
    try:
        done = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostError(f"'{command_line(args)}' did not answer within {timeout:g}s", "check the cluster") from None
    except OSError as exc:
        raise HostError(f"cannot run '{command_line(args)}': {exc.strerror}", "check the kubectl on PATH") from None
    if done.returncode:
        said = next((line for line in done.stderr.splitlines() if line.strip()), f"exit {done.returncode}")
        kind = NotFound if NOT_FOUND in done.stderr else HostError
        raise kind(f"'{command_line(args)}' failed: {said.strip()}", "check kubectl's context and access")
    return done.stdout


def kubectl_json(args: list[str]) -> dict:
    """``kubectl ... -o json`` read back."""
    text = kubectl([*args, "-o", "json"])
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise HostError(
            f"'{command_line([*args, '-o', 'json'])}' printed no JSON", "check the kubectl on PATH"
        ) from None

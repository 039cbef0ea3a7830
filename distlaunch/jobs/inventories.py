"""What a hostfile's hosts last reported about themselves, kept a while under the state directory so that a second
plan of the same hosts is decided at once, without contacting them:

    $DISTLAUNCH_STATE_DIR/inventories/<key>.json   {"at": unix time, "hosts": {host: inventory}}

The key names the hostfile (its path and text) and the ssh_config that reaches its hosts: another file, or the same
one edited, is another set of hosts. A failed preflight forgets its entry: the hosts may have changed since.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

from distlaunch.contract.inventory import HostInventory
from distlaunch.jobs.store import state_dir

KEEP_S = 600.0  # how long the hosts' facts are trusted without asking them again


class Remembered(BaseModel):
    """The hosts' inventories as read at ``at``."""

    at: float
    hosts: dict[str, HostInventory]

    def age(self) -> float:
        return max(0.0, time.time() - self.at)


def _text(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # an inline host list (-H node1:2,node2:2), or no such file: its name is the key
        return ""


def cache_key(hostfile: Path, ssh_config: Path | None) -> str:
    """The entry of these hosts: the hostfile's absolute path and text, and the ssh_config's."""
    parts = [os.path.abspath(hostfile), _text(hostfile), str(ssh_config or ""), _text(ssh_config)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _entry(key: str) -> Path:
    return state_dir() / "inventories" / f"{key}.json"


def remembered(key: str, keep_s: float = KEEP_S) -> Remembered | None:
    """The inventories kept for ``key`` and younger than ``keep_s``; None where there are none (or unreadable)."""
    try:
        found = Remembered.model_validate_json(_entry(key).read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError):
        return None
    return found if found.age() < keep_s else None


def remember(key: str, hosts: dict[str, HostInventory]) -> None:
    """Keep what the hosts reported, now (atomically: a reader sees the old entry or the new one). Bookkeeping:
    a state directory that cannot be written costs only the next plan's speed."""
    entry = _entry(key)
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"at": time.time(), "hosts": {h: inv.model_dump(mode="json") for h, inv in hosts.items()}}
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".inventory-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def forget(key: str) -> None:
    """Drop the entry of ``key``: its hosts failed a preflight, so what they said before is not trusted."""
    with contextlib.suppress(OSError):
        _entry(key).unlink()

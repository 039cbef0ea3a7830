"""Rank stacks gathered on a hang: parse faulthandler / py-spy dumps, group identical ones, and say in one
line which ranks wait where ("ranks 0-2 in all_reduce (x.py:42); rank 3 in <module> (x.py:40) on node2")."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from distlaunch.contract.report import StackGroup
from distlaunch.readable import ranges

_FAULTHANDLER = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_PYSPY = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^:()]+):(?P<line>\d+)\)")
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "/distlaunch/rankboot.py")


class Frame(BaseModel):
    func: str
    file: str
    line: int

    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


def main_thread_frames(text: str) -> list[Frame]:
    """Frames of the thread running the program's main code, innermost first (as both tools print them)."""
    threads: list[list[Frame]] = [[]]
    for raw in text.splitlines():
        if raw.startswith(("Thread ", "Current thread ")) and threads[-1]:
            threads.append([])
        match = _FAULTHANDLER.match(raw) or _PYSPY.match(raw)
        if match:
            # py-spy names a method with its class ('Condition.wait'), faulthandler without: one name for both,
            # so a host with py-spy and one without group the ranks that wait at the same place together
            func = match["func"].rsplit(".", 1)[-1]
            threads[-1].append(Frame(func=func, file=match["file"], line=int(match["line"])))
    with_main = [t for t in threads if any(f.func == "<module>" for f in t)]
    return (with_main or threads)[0]


NO_STACK = "no stack (not a Python rank, or it ended)"


def where_it_waits(frames: list[Frame]) -> str:
    """The innermost function, and the innermost frame of the user's own code: 'all_reduce (x.py:42)'."""
    if not frames:
        return NO_STACK
    user = next((f for f in frames if not any(mark in f.file for mark in _LIBRARY)), frames[0])
    return f"{frames[0].func} ({user.where()})"


def group_stacks(stacks: dict[int, str], host_of: dict[int, str]) -> list[StackGroup]:
    """Ranks with the same waiting place together, the biggest group first."""
    groups: dict[str, list[int]] = {}
    for rank, text in sorted(stacks.items()):
        groups.setdefault(where_it_waits(main_thread_frames(text)), []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return [StackGroup(where=w, ranks=r, hosts=sorted({host_of[x] for x in r})) for w, r in ordered]


def summary(groups: list[StackGroup]) -> str:
    """One line; the odd ranks out (every group but the biggest) are named with their hosts."""
    parts = []
    for i, g in enumerate(groups):
        label = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {ranges(g.ranks)}"
        verb = ("waits in" if len(g.ranks) == 1 else "wait in") if i == 0 else "in"
        text = f"{label}: {g.where}" if g.where == NO_STACK else f"{label} {verb} {g.where}"
        if i > 0:
            text += f" on {', '.join(g.hosts)}"
        parts.append(text)
    return "; ".join(parts)


def summarise_stacks(stacks: dict[int, dict], host_of: dict[int, str]) -> tuple[list[StackGroup], str]:
    """The groups of ranks by where they wait (from agents' stacks events), and the one-line summary, which
    names the ranks that sent none."""
    missing = sorted(set(host_of) - set(stacks))
    groups = group_stacks({rank: event.get("text", "") for rank, event in stacks.items()}, host_of)
    parts = [summary(groups)] if groups else []
    parts += [f"no stack from ranks {ranges(missing)}"] if missing else []
    return groups, "; ".join(parts) or "no rank is running"


def write_rank_stacks(folder: Path, stacks: dict[int, dict], host_of: dict[int, str]) -> None:
    """Write each rank's full stack (an agent's stacks event) to ``folder/rank<N>.txt``."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, event in sorted(stacks.items()):
        head = f"# rank {rank} on {host_of[rank]} ({event.get('tool', 'none')})\n"
        (folder / f"rank{rank}.txt").write_text(head + event.get("text", ""), encoding="utf-8")

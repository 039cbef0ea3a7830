"""Hostfile parsing (DeepSpeed/OpenMPI ``node1 slots=8``, MPICH/Horovod ``node1:8``, bare ``node1``)
and DeepSpeed-style ``--include`` / ``--exclude`` filters (``node1:0,1@node2``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel

from distlaunch.contract.hostname import host_key, host_problem, ip_address, split_host
from distlaunch.errors import UsageError, closest
from distlaunch.files import os_error_words, read_settings

DEFAULT_MAX_RANKS = 65536


def max_ranks() -> int:
    """The ceiling on ranks per host and on the world size: 65,536, or DISTLAUNCH_MAX_RANKS when set."""
    text = os.environ.get("DISTLAUNCH_MAX_RANKS", "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_RANKS


def check_rank_count(count: int, what: str) -> None:
    """Refuse a count of ranks above the ceiling before anything is sized by it."""
    ceiling = max_ranks()
    if count > ceiling:
        raise UsageError(
            f"{what} is {count} ranks, more than distlaunch's ceiling of {ceiling:,}",
            "check the number; for a larger job raise the ceiling with DISTLAUNCH_MAX_RANKS=N",
        )


class HostSlots(BaseModel):
    """One host of the job and the slots (process or GPU indices) it runs."""

    host: str
    slots: list[int]
    explicit: bool = True  # False for a bare ``node1`` line: its count may come from --nproc-per-node
    line: int | None = None

    @property
    def nslots(self) -> int:
        return len(self.slots)


def _err(where: str, lineno: int, line: str, what: str, hint: str) -> UsageError:
    return UsageError(f"hostfile {where} line {lineno} {line.strip()!r}: {what}", hint)


def _parse_count(text: str, where: str, lineno: int, line: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise _err(
            where,
            lineno,
            line,
            f"slots {text!r} is not a whole number",
            "write slots as a positive integer, e.g. slots=8",
        ) from None
    if count <= 0:
        raise _err(
            where,
            lineno,
            line,
            f"slots={count} must be at least 1",
            "give every host at least one slot, or remove the line",
        )
    if count > max_ranks():
        raise _err(
            where,
            lineno,
            line,
            f"slots={count} is more than distlaunch's ceiling of {max_ranks():,} ranks",
            "check the number; for a larger job raise the ceiling with DISTLAUNCH_MAX_RANKS=N",
        )
    return count


def _check_host(name: str, where: str, lineno: int, line: str) -> str:
    problem = host_problem(name)
    if problem is not None:
        raise _err(where, lineno, line, *problem)
    return name


def _parse_line(line: str, where: str, lineno: int) -> HostSlots:
    fields = line.split()
    name, count = split_host(fields[0])
    name, rest = _check_host(name, where, lineno, line), fields[1:]
    if count is not None:
        if rest:
            raise _err(
                where,
                lineno,
                line,
                "unexpected text after host:count",
                "use either 'node1:8' or 'node1 slots=8', not both",
            )
        return HostSlots(host=name, slots=list(range(_parse_count(count, where, lineno, line))), line=lineno)
    if not rest:
        return HostSlots(host=name, slots=[0], explicit=False, line=lineno)
    count = _parse_fields(rest, where, lineno, line)
    return HostSlots(host=name, slots=list(range(count)), line=lineno)


def _parse_fields(fields: list[str], where: str, lineno: int, line: str) -> int:
    """The ``slots=N`` (and the ignored ``max_slots=N``) after a host name; returns N."""
    count = None
    given: dict[str, str] = {}  # slots / max_slots → the field as written: a second one is an error, not a guess
    for field in fields:
        key, eq, value = field.partition("=")
        name = key.replace("-", "_")
        if eq and name in ("slots", "max_slots"):
            if name in given:
                raise _err(
                    where,
                    lineno,
                    line,
                    f"{name} is given twice ({given[name]!r}, then {field!r})",
                    f"give {name} once, e.g. 'node1 slots=8'",
                )
            given[name] = field
            if name == "slots":  # max_slots is OpenMPI's upper bound: accepted for compatibility, slots decides
                count = _parse_count(value, where, lineno, line)
        elif key in ("slot", "slot_count", "gpus", "ngpus", "procs", "np") or key.isdigit():
            guess = value if eq else key
            raise _err(where, lineno, line, f"unknown field {field!r}", f"did you mean slots={guess}?")
        elif eq and (near := closest(name, ("slots", "max_slots"))):  # a typo: slts=8
            raise _err(where, lineno, line, f"unknown field {field!r}", f"did you mean {near}={value}?")
        else:
            raise _err(
                where, lineno, line, f"unknown field {field!r}", "write 'host slots=N', 'host:N' or a bare 'host'"
            )
    if count is None:
        raise _err(where, lineno, line, "no slots=N given", "write 'host slots=N'")
    return count


def _spelled(first: str, again: str) -> str:
    """How a repeated host was first written, when the spelling differs (NODE1 after node1)."""
    if first == again:
        return ""
    same = "the same address" if ip_address(first) is not None else "the same host: host names ignore case"
    return f" as {first!r} ({same})"


def parse_hostfile_text(text: str, where: str = "<hostfile>") -> list[HostSlots]:
    """Parse hostfile text into hosts in file order; raise UsageError naming file, line and fix."""
    hosts: list[HostSlots] = []
    seen: dict[str, HostSlots] = {}  # host_key → the first entry: NODE1 repeats node1
    total = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        entry = _parse_line(line, where, lineno)
        first = seen.get(host_key(entry.host))
        if first is not None:
            raise _err(
                where,
                lineno,
                raw,
                f"host {entry.host!r} is already listed on line {first.line}{_spelled(first.host, entry.host)}",
                "list each host once and give it all its slots (slots=N)",
            )
        seen[host_key(entry.host)] = entry
        hosts.append(entry)
        total += entry.nslots
        check_rank_count(total, f"the world size of hostfile {where} (up to line {lineno})")
    if not hosts:
        raise UsageError(f"hostfile {where} lists no hosts", "add one line per host, e.g. 'node1 slots=8'")
    return hosts


def read_hostfile(path: str | Path) -> list[HostSlots]:
    """Read and parse a hostfile from disk."""
    p = Path(path)
    try:
        # utf-8-sig: a byte-order mark that Windows editors put first is not part of the first host name.
        text = read_settings(p, encoding="utf-8-sig")
    except FileNotFoundError:
        hint = "check the path given to -H/--hostfile"
        if re.fullmatch(r"[\w\-]+", str(p)):  # a bare host name, as Horovod's -H takes one: say how ours reads
            hint += f"; to list hosts in its place, give each its process count: -H {p}:1 (or -H {p}:2,other:2)"
        raise UsageError(f"hostfile {str(p)!r} does not exist", hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"hostfile {str(p)!r} cannot be read: {os_error_words(exc)}", "pass a readable UTF-8 text file"
        ) from None
    return parse_hostfile_text(text, str(p))


FILTER_SYNTAX = "name hosts separated by '@', each with optional slots: node1:0,1@node2 ([fe80::1]:0 for IPv6)"

# A filter as written: (host as the user spelled it, the slots named, or None for all of the host's slots).
FilterEntry = tuple[str, set[int] | None]


def _parse_filter(spec: str, option: str) -> list[FilterEntry]:
    """Parse ``node1:0,1@node2`` into its entries, in the order written."""
    if not spec.strip():
        raise UsageError(f"{option} {spec!r} names no hosts", f"{FILTER_SYNTAX}; or leave {option} out")
    entries = []
    for part in spec.split("@"):
        part = part.strip()
        if not part:
            raise UsageError(
                f"{option} {spec!r} has an empty entry", "separate hosts with a single '@', e.g. node1:0,1@node2"
            )
        name, slots = split_host(part)
        if slots is None:
            entries.append((name, None))
            continue
        try:
            entries.append((name, {int(s) for s in slots.split(",")}))
        except ValueError:
            raise UsageError(
                f"{option} {spec!r}: slots {slots!r} of {name!r} are not integers",
                "list slot indices separated by commas, e.g. node1:0,1",
            ) from None
    return entries


def _known_hosts_hint(name: str, hosts: list[HostSlots]) -> str:
    known = f"known hosts: {', '.join(h.host for h in hosts)}"
    # fe80::1:0 is itself an address (a bare IPv6 address never has slots): the user likely meant [fe80::1]:0.
    return f"{known}; slots of an IPv6 host follow brackets, e.g. [fe80::1]:0" if ":" in name else known


def _resolve_filter(entries: list[FilterEntry], hosts: list[HostSlots], option: str) -> dict[str, set[int] | None]:
    """The filter by the hostfile's own host names. Entries naming one host merge (node1:0@node1:1 is
    node1:0,1), and a bare name means all of the host's slots, whatever else names it."""
    by_key = {host_key(h.host): h for h in hosts}
    chosen: dict[str, set[int] | None] = {}
    for name, slots in entries:
        host = by_key.get(host_key(name))
        if host is None:
            raise UsageError(f"{option}: host {name!r} is not in the hostfile", _known_hosts_hint(name, hosts))
        bad = sorted(s for s in slots or () if s not in host.slots)
        if bad:
            raise UsageError(
                f"{option}: host {name!r} has no slot {bad[0]}",
                f"{host.host} has slots {host.slots[0]}..{host.slots[-1]}",
            )
        before = chosen.get(host.host, set())
        chosen[host.host] = None if before is None or slots is None else before | slots
    return chosen


def _only(host: HostSlots, slots: set[int] | None) -> HostSlots:
    """``host`` cut down to ``slots`` (None: all of them)."""
    return host if slots is None else host.model_copy(update={"slots": [s for s in host.slots if s in slots]})


def _without(host: HostSlots, slots: set[int] | None) -> HostSlots:
    """``host`` without ``slots`` (None: all of them, which leaves none)."""
    return host.model_copy(update={"slots": [] if slots is None else [s for s in host.slots if s not in slots]})


def apply_filters(hosts: list[HostSlots], include: str | None = None, exclude: str | None = None) -> list[HostSlots]:
    """Keep only the hosts/slots named by --include, then drop those named by --exclude."""
    # ``is not None``: an empty filter is a mistake to report, not a filter that is absent.
    if include is not None and exclude is not None:
        raise UsageError("--include and --exclude were both given", "use one of them")
    if include is not None:
        chosen = _resolve_filter(_parse_filter(include, "--include"), hosts, "--include")
        return [_only(h, chosen[h.host]) for h in hosts if h.host in chosen]
    if exclude is not None:
        dropped = _resolve_filter(_parse_filter(exclude, "--exclude"), hosts, "--exclude")
        kept = [_without(h, dropped[h.host]) if h.host in dropped else h for h in hosts]
        kept = [h for h in kept if h.slots]
        if not kept:
            raise UsageError(f"--exclude {exclude!r} removes every host", "leave at least one host or slot")
        return kept
    return hosts

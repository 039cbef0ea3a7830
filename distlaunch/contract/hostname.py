"""Host names as hostfiles and ``--include``/``--exclude`` write them: DNS names, ssh_config aliases and IP
addresses, IPv6 either bare (``fe80::1``) or in brackets (``[fe80::1]:8``), and which spellings are one host."""

from __future__ import annotations

import ipaddress
import re

# Letters, digits, and . - _ as OpenSSH and DNS accept them (no user@: users belong in ssh_config).
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_ZONE_RE = re.compile(r"[A-Za-z0-9_.\-]+")
MAX_NAME = 253  # RFC 1035: a name's text form, without the root's trailing dot
MAX_LABEL = 63  # RFC 1035: the text between two dots
NAME_HINT = "use a host name, an IP address ([fe80::1]:8 for IPv6 with a count) or an ssh_config alias"


def ip_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``text`` spells, or None for a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    # Python takes any text after % as an IPv6 zone; a real one is an interface name or index (fe80::1%eth0).
    zone = getattr(address, "scope_id", None)
    return address if zone is None or _ZONE_RE.fullmatch(zone) else None


def _is_ipv6(text: str) -> bool:
    return isinstance(ip_address(text), ipaddress.IPv6Address)


def split_host(field: str) -> tuple[str, str | None]:
    """``host``, ``host:N``, ``[v6]``, ``[v6]:N`` or a bare IPv6 address → (host without brackets, N or None).

    A bare IPv6 address never carries a count: ``::1:2`` is itself an address, so reading its last group
    as a count would be a guess. A count for an IPv6 host goes after brackets, or as ``slots=N``.
    """
    if field.startswith("["):
        inside, close, tail = field[1:].partition("]")
        if close and _is_ipv6(inside) and (not tail or tail.startswith(":")):
            return inside, tail[1:] if tail else None
        return field, None  # not a bracketed IPv6 address: the host check names the whole field
    if _is_ipv6(field):
        return field, None
    name, colon, count = field.rpartition(":")
    return (name, count) if colon else (field, None)


def host_problem(name: str) -> tuple[str, str] | None:
    """What is wrong with ``name`` as a host (message, hint), or None when it is an address or a valid name."""
    if ip_address(name) is not None:
        return None
    if not _NAME_RE.fullmatch(name):
        return f"{name!r} is not a valid host name", NAME_HINT
    dns_hint = f"a DNS name has at most {MAX_NAME} characters and {MAX_LABEL} between dots; check the name"
    text = name.removesuffix(".")  # the root's dot (node1.example.com.) is not counted
    if len(text) > MAX_NAME:
        return f"host name {_short(name)} has {len(text)} characters, more than a DNS name's {MAX_NAME}", dns_hint
    long_label = next((label for label in text.split(".") if len(label) > MAX_LABEL), None)
    if long_label is not None:
        return (
            f"the label {_short(long_label)} of the host name has {len(long_label)} characters, "
            f"more than a DNS label's {MAX_LABEL}",
            dns_hint,
        )
    return None


def _short(text: str, keep: int = 24) -> str:
    """A long value cut to its start, so the one-line error stays readable (the line itself is shown)."""
    return repr(text) if len(text) <= keep else repr(text[:keep] + "…")


def host_key(name: str) -> str:
    """One spelling per host: DNS names and aliases are case-insensitive, an IP address has one canonical form
    (``NODE1`` is ``node1``; ``0:0::1`` and ``::1`` are one address)."""
    address = ip_address(name)
    return str(address) if address is not None else name.lower()


def host_port(host: str, port: int) -> str:
    """``host:port`` as people and URLs write it: an IPv6 address in brackets (``[fe80::1]:29500``), since
    its own colons would make ``fe80::1:29500`` read as another address."""
    return f"[{host}]:{port}" if _is_ipv6(host) else f"{host}:{port}"

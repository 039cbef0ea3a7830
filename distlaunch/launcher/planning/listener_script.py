"""The master's stand-in for rank 0's TCPStore: one stdlib-only script, run as ``PYTHON -c SOURCE ARGS_JSON``
on the master host (not from stdin: stdin stays open, and its end tells the listener to stop).

It first looks for anything already listening on the port (on any address: rank 0 binds them all, so a
process on another address still makes training fail), naming the holder from /proc, and binds the port on
every address once, as rank 0 will (an open connection's local port fails there). Then it binds
MASTER_ADDR:MASTER_PORT, prints one JSON line, and greets every host that connects with a nonce, so a
host that reaches some other service on that address is told apart from one that reaches the master.
It stops when its stdin closes (the doctor is done) or after a hard limit, so it can never linger.
"""

import contextlib
import errno
import json
import os
import select
import socket
import sys
import time

MAX_LIFETIME_S = 120.0
BANNER = b"distlaunch-doctor "


def listening_inodes(port):
    """Inodes of sockets in LISTEN state on ``port``, with their local address, from /proc/net/tcp{,6}."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            address, _, port_hex = local.rpartition(":")
            if state == "0A" and int(port_hex, 16) == port:
                found[inode] = decode_address(address)
    return found


def decode_address(hex_address):
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])  # /proc prints IPv4 as a little-endian word
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def holders(port):
    """Who listens on ``port``: [{address, pid, command}] (pid None where /proc does not tell us)."""
    inodes = listening_inodes(port)
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")) if inodes else ():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = link[8:-1] if link.startswith("socket:[") else None
            if inode in inodes and inode not in found:
                found[inode] = {"address": inodes[inode], "pid": int(pid), "command": command_of(pid)}
    return [found.get(inode, {"address": address, "pid": None, "command": None}) for inode, address in inodes.items()]


def describe_holders(found):
    """Who holds a port (``holders``), each process once with all its addresses ('pid 7 (cmd) listens on a,
    b'), in one line; and the pids to stop. Used where the port is refused (doctor, run), not by the script."""
    named, unnamed = {}, []
    for h in found:
        if h.get("pid"):
            command = " ".join((h.get("command") or "?").split())  # a command line may hold newlines: one line
            named.setdefault(h["pid"], (command, []))[1].append(h["address"])
        else:
            unnamed.append(h["address"])
    parts = [
        f"pid {pid} ({command}) listens on {', '.join(dict.fromkeys(addrs))}" for pid, (command, addrs) in named.items()
    ]
    if unnamed:
        parts.append(
            f"a process of another user listens on {', '.join(dict.fromkeys(unnamed))} (run as root to name it)"
        )
    return "; ".join(parts), list(named)


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(part.decode(errors="replace") for part in f.read().split(b"\0") if part)[:200]
    except OSError:
        return None


def bind(address, port):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore: TIME_WAIT leftovers do not count
    try:
        sock.bind((address, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        return (
            None,
            {errno.EADDRINUSE: "in-use", errno.EADDRNOTAVAIL: "not-local", errno.EACCES: "denied"}.get(
                exc.errno, "error"
            ),
            exc.strerror or str(exc),
        )
    return sock, None, None


def bind_every_address(port, ipv6=False):
    """Bind ``port`` on every address and let it go, as rank 0's TCPStore will bind it: (reason, error), both
    None when it can. A connection whose local port this is blocks it, though nothing listens there."""
    sock, reason, error = bind("::" if ipv6 else "0.0.0.0", port)
    if sock is not None:
        sock.close()
    return reason, error


def ephemeral_range():
    """The ports the kernel gives outgoing connections here (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(word) for word in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


def free_port_near(port, address, tries=256):
    """The nearest port above ``port`` (else below it, down to 1024) that rank 0 could take on this host now:
    nothing listens on it on any address, it binds on every address and on ``address``. Ports of the kernel's
    ephemeral range come last (any outgoing connection may take them meanwhile). None when ``tries`` ports
    were all taken."""
    low, high = ephemeral_range()
    near = [*range(max(port + 1, 1024), 65536), *range(port - 1, 1023, -1)]
    ordered = [p for p in near if not low <= p <= high] + [p for p in near if low <= p <= high]
    for candidate in ordered[:tries]:
        if listening_inodes(candidate) or bind_every_address(candidate, ":" in address)[0] is not None:
            continue
        sock, _, _ = bind(address, candidate)
        if sock is not None:
            sock.close()
            return candidate
    return None


def serve(sock, nonce):
    """Greet every connection until stdin closes; return the peers that connected."""
    peers = []
    deadline = time.monotonic() + MAX_LIFETIME_S
    stdin = sys.stdin.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock, stdin], [], [], 1.0)
        if stdin in ready and not os.read(stdin, 4096):
            break
        if sock in ready:
            conn, peer = sock.accept()
            with conn, contextlib.suppress(OSError):
                conn.sendall(BANNER + nonce.encode() + b"\n")
            peers.append(peer[0])
    return peers


def main():
    args = json.loads(sys.argv[1])
    port = args["port"]
    try:
        infos = socket.getaddrinfo(args["master_addr"], port, type=socket.SOCK_STREAM)
    except OSError as exc:
        print(
            json.dumps(
                {"ev": "listener", "bound": False, "reason": "dns", "error": str(exc), "holders": holders(port)}
            ),
            flush=True,
        )
        return
    address = next((i[4][0] for i in infos if i[0] == socket.AF_INET), infos[0][4][0])
    held = holders(port)
    sock = None
    reason, error = bind_every_address(port, ":" in address)  # MASTER_ADDR alone may bind where rank 0 cannot
    if reason is None:
        sock, reason, error = bind(address, port)
    elif reason == "in-use" and not held:
        error = "a connection on this host uses it as its local port, and rank 0's store binds every address"
    # a port to suggest instead, checked here on the master (not-local: the port is not the problem)
    suggest = free_port_near(port, address) if sock is None and reason in ("in-use", "denied", "error") else None
    print(
        json.dumps(
            {
                "ev": "listener",
                "bound": sock is not None,
                "address": address,
                "reason": reason,
                "error": error,
                "holders": held,
                "suggest": suggest,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    if sock is not None:
        with sock:
            print(json.dumps({"peers": serve(sock, args["nonce"])}), flush=True)


if __name__ == "__main__":
    main()

"""The per-host probe: one stdlib-only script, run as ``PYTHON - ARGS_JSON`` with this source on stdin.

It gathers every fact the doctor needs from a host in one round trip and prints them as one JSON
object: the host's inventory (GPUs, CPUs, interfaces, InfiniBand) from the shared probe,
distlaunch/hostprobe.py, whose source is sent before this one, and what only the doctor asks. It must
run on a bare interpreter (no distlaunch, no torch installed), so it imports only the standard library,
and it never imports torch: versions come from package metadata and torch's own ``version.py``, which
takes milliseconds instead of the seconds an import of torch (and CUDA) costs.
"""

import importlib.util
import json
import os
import re
import resource
import socket
import sys
import time

if "inventory" not in globals():  # run as a module; sent to a host, gather.py puts hostprobe.py's source first
    from distlaunch.hostprobe import inventory, nccl_version, read

BANNER = b"distlaunch-doctor "


def addresses_of(name):
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)})
    except OSError as exc:
        return {"error": str(exc)}


def dist_version(name):
    import importlib.metadata  # only where needed: it costs more than the rest of the probe together

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_version(name):
    """``__version__`` of an importable package, read from its source (nothing is imported)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = next(iter(spec.submodule_search_locations))
    for module in ("version.py", "__init__.py"):
        found = re.search(
            r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", read(os.path.join(root, module)) or "", re.M
        )
        if found:
            return found.group(1)
    return dist_version(name)


def torch_facts():
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    root = next(iter(spec.submodule_search_locations))
    version_py = read(os.path.join(root, "version.py")) or ""
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", version_py, re.M)
    nccl = None
    if cuda:  # CPU builds have no NCCL: skip the (slow) package metadata scan
        libs = os.listdir(os.path.join(root, "lib")) if os.path.isdir(os.path.join(root, "lib")) else []
        bundled = "bundled" if any(lib.startswith("libnccl") for lib in libs) else None
        nccl = nccl_version() or bundled
    return {"version": package_version("torch"), "cuda": cuda.group(1) if cuda else None, "nccl": nccl, "path": root}


def route_to(address, interfaces):
    """The source address the kernel picks toward ``address`` (a UDP "connection" sends nothing), and the
    interface that owns it: on the master itself that is the interface of MASTER_ADDR, not lo."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            src = s.getsockname()[0]
    except OSError as exc:
        return {"error": str(exc)}
    dev = next((i["name"] for i in interfaces if src in [a.partition("/")[0] for a in i["addresses"]]), None)
    return {"dev": dev, "src": src}


def connect_to_master(address, port, timeout):
    started = time.monotonic()
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            banner = b""
            while not banner.endswith(b"\n") and len(banner) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                banner += chunk
        token = banner[len(BANNER) :].strip().decode() if banner.startswith(BANNER) else None
        return {"result": "ok", "token": token, "seconds": time.monotonic() - started}
    except ConnectionRefusedError:
        return {"result": "refused", "seconds": time.monotonic() - started}
    except TimeoutError:
        return {"result": "timeout", "seconds": time.monotonic() - started}
    except OSError as exc:
        return {"result": "error", "error": exc.strerror or str(exc), "seconds": time.monotonic() - started}


def master_facts(args, interfaces):
    resolved = addresses_of(args["master_addr"])
    if isinstance(resolved, dict):
        return {"resolved": None, "error": resolved["error"]}
    address = next((a for a in resolved if ":" not in a), resolved[0])  # IPv4 first, as gloo and NCCL prefer it
    facts = {"resolved": resolved, "address": address, "route": route_to(address, interfaces)}
    if args.get("port"):
        facts["connect"] = connect_to_master(address, args["port"], args.get("timeout", 2.5))
    return facts


def workdir_facts(path):
    """Whether the ranks can start in ``path``: ``problem`` None, or what is wrong with it."""
    if not os.path.exists(path):
        problem = "does not exist"
    elif not os.path.isdir(path):
        problem = "is not a directory"
    elif not os.access(path, os.X_OK):
        problem = "cannot be entered (no permission)"
    else:
        problem = None
    return {"path": path, "problem": problem}


def main():
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    hostname = socket.gethostname()
    fqdn = socket.getfqdn()
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_blocks * shm.f_frsize
    except OSError:
        shm_bytes = None
    host = inventory()
    facts = {
        "ev": "probe",  # what the doctor looks for after any login banner
        "hostname": hostname,
        "fqdn": fqdn,
        "hostname_addrs": addresses_of(hostname),
        "fqdn_addrs": addresses_of(fqdn),
        "machine_id": read("/etc/machine-id") or read("/var/lib/dbus/machine-id"),
        "boot_id": read("/proc/sys/kernel/random/boot_id"),
        "python": {"executable": sys.executable, "version": ".".join(map(str, sys.version_info[:3]))},
        "distlaunch": package_version("distlaunch"),
        "torch": torch_facts(),
        "inventory": host,
        "shm_bytes": shm_bytes,
        "memlock": -1 if memlock == resource.RLIM_INFINITY else memlock,
    }
    if args.get("workdir"):
        facts["workdir"] = workdir_facts(args["workdir"])
    if args.get("master_addr"):
        facts["master"] = master_facts(args, host["interfaces"])
    facts["time"] = time.time()  # last, so it is as close as possible to the moment the answer leaves
    print(json.dumps(facts))


if __name__ == "__main__":
    main()

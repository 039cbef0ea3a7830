"""The per-host probe: one stdlib-only script, run as ``PYTHON - ARGS_JSON`` with this source on stdin.

It gathers every fact the doctor needs from a host in one round trip and prints them as one JSON
object. It must run on a bare interpreter (no distlaunch, no torch installed), so it imports only the
standard library, and it never imports torch: versions come from package metadata and torch's own
``version.py``, which takes milliseconds instead of the seconds an import of torch (and CUDA) costs.
"""

import importlib.util
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time

NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
BANNER = b"distlaunch-doctor "


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def addresses_of(name):
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)})
    except OSError as exc:
        return {"error": str(exc)}


def run(argv, timeout=5.0):
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


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
        nccl = next((v for v in map(dist_version, NCCL_DISTS) if v), bundled)
    return {"version": package_version("torch"), "cuda": cuda.group(1) if cuda else None, "nccl": nccl, "path": root}


def gpu_facts():
    out = run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    if out is not None:
        return {
            "source": "nvidia-smi",
            "names": [line.split(",")[0].strip() for line in out.splitlines() if line.strip()],
        }
    try:
        return {"source": "/proc/driver/nvidia", "names": sorted(os.listdir("/proc/driver/nvidia/gpus"))}
    except OSError:
        return {"source": "none", "names": []}


def ipv4_of(name):
    """The interface's IPv4 address via the SIOCGIFADDR ioctl (no subprocess: the probe runs on every host)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return []
    return [socket.inet_ntoa(packed[20:24])]


def ipv6_by_interface():
    found = {}
    for line in (read("/proc/net/if_inet6") or "").splitlines():
        fields = line.split()
        if len(fields) == 6:
            found.setdefault(fields[5], []).append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(fields[0])))
    return found


def interface_facts():
    names = (
        sorted(os.listdir("/sys/class/net"))
        if os.path.isdir("/sys/class/net")
        else [n for _, n in socket.if_nameindex()]
    )
    v6 = ipv6_by_interface()
    out = []
    for name in names:
        flags = read(f"/sys/class/net/{name}/flags")
        up = bool(int(flags, 16) & 1) if flags else read(f"/sys/class/net/{name}/operstate") in ("up", "unknown")
        out.append({"name": name, "up": up, "addrs": ipv4_of(name) + v6.get(name, [])})
    return out


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
    dev = next((i["name"] for i in interfaces if src in i["addrs"]), None)
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
    interfaces = interface_facts()
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
        "gpus": gpu_facts(),
        "interfaces": interfaces,
        "shm_bytes": shm_bytes,
        "memlock": -1 if memlock == resource.RLIM_INFINITY else memlock,
        "infiniband": sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else [],
    }
    if args.get("master_addr"):
        facts["master"] = master_facts(args, interfaces)
    facts["time"] = time.time()  # last, so it is as close as possible to the moment the answer leaves
    print(json.dumps(facts))


if __name__ == "__main__":
    main()

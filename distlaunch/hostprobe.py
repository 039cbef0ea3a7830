"""The host inventory's probe: what this host has (GPUs, CPUs and NUMA nodes, memory, network interfaces,
InfiniBand, the NVIDIA driver and NCCL), read from the kernel's and the driver's files, as one JSON-able dict.

Standard library only, and nothing else of distlaunch: the agent imports it on every host for its hello, and the
doctor sends this file's source to bare interpreters (gather.py). It must take milliseconds: only files are read,
plus ``ip -j addr`` where it exists and nvidia-smi only where the driver's files show GPUs. Every file may be
absent or garbled: a fact then is None or empty, never an exception.

The shape (``distlaunch.contract.inventory.HostInventory`` parses it)::

    {"gpus": [{"index": 0, "model": "NVIDIA H100", "memory_mib": 81559, "bus_id": "0000:18:00.0",
               "uuid": "GPU-…", "numa_node": 0}],
     "gpu_source": "nvidia-smi" | "driver" | null,
     "cpus": 64, "affinity": "0-63",                     os.cpu_count(); the CPUs this process may run on
     "memory_mib": 515697, "memory_available_mib": 498012,  /proc/meminfo's MemTotal and MemAvailable
     "numa_nodes": [{"id": 0, "cpus": "0-31"}],          CPU lists in the kernel's own syntax
     "interfaces": [{"name": "eth0", "up": true, "state": "up", "speed_mbps": 25000,
                     "addresses": ["10.0.0.5/24", "fe80::1/64"]}],
     "default_interface": "eth0",                        the IPv4 default route's device
     "ib_devices": [{"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": 200.0,
                                                  "link_layer": "InfiniBand"}]}],
     "cuda_driver": "550.54.15", "nccl": "2.21.5"}
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

DRIVER = "/proc/driver/nvidia"
NODES = "/sys/devices/system/node"
PCI_DEVICES = "/sys/bus/pci/devices"
MEMINFO = "/proc/meminfo"
NET = "/sys/class/net"
INFINIBAND = "/sys/class/infiniband"
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")  # the wheels torch's CUDA builds bring
SMI_TIMEOUT_S = 3.0  # nvidia-smi on a host whose driver is wedged never answers: the hello must not wait for it
IP_TIMEOUT_S = 2.0
SMI_QUERY = "index,pci.bus_id,name,memory.total,uuid,driver_version"
MAX_CPUS = 1 << 16  # a cpulist beyond this is garbled, not a machine


def read(path):
    """The file's text, stripped; None where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def listdir(path):
    """The folder's entries, sorted; empty where it cannot be listed."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def number(text, kind=int):
    """``text`` as a number, or None."""
    try:
        return kind(text)
    except (TypeError, ValueError):
        return None


def run(argv, timeout):
    """The program's stdout, or None where it is missing, fails or takes longer than ``timeout``."""
    if not shutil.which(argv[0]):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_cpulist(text):
    """The kernel's CPU list syntax (``0-3,8,10-11``) as a sorted list of CPU numbers; None where garbled."""
    cpus = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = number(low), number(high or low)
        if first is None or last is None or not 0 <= first <= last < MAX_CPUS:
            return None
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus):
    """CPU numbers in the kernel's CPU list syntax: runs as ``a-b``, joined by commas."""
    runs = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def bus_id(text):
    """A PCI address as sysfs names it (``0000:18:00.0``): lower case, a four-digit domain (nvidia-smi writes
    eight); None where it is not one."""
    found = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", (text or "").strip())
    if not found:
        return None
    domain, bus, device, function = found.groups()
    return f"{int(domain or '0', 16) & 0xFFFF:04x}:{bus}:{device}.{function}".lower()


def driver_fields(text):
    """The ``Key: value`` lines of a file: one of the driver's ``information`` files, or /proc/meminfo."""
    fields = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def driver_gpus():
    """The GPUs the driver's files name (/proc/driver/nvidia/gpus/*/information), in PCI order."""
    gpus = []
    for entry in listdir(f"{DRIVER}/gpus"):
        fields = driver_fields(read(f"{DRIVER}/gpus/{entry}/information"))
        bus = bus_id(fields.get("Bus Location")) or bus_id(entry)
        gpus.append({"model": fields.get("Model") or None, "bus_id": bus, "uuid": fields.get("GPU UUID") or None})
    gpus.sort(key=lambda g: g["bus_id"] or "")
    return gpus


def parse_smi(text):
    """nvidia-smi's ``--query-gpu=SMI_QUERY --format=csv,noheader,nounits`` rows, one dict per GPU."""
    rows = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_QUERY.split(",")) or number(cells[0]) is None:
            continue
        index, bus, name, memory, uuid, driver = cells
        rows.append(
            {
                "index": int(index),
                "bus_id": bus_id(bus),
                "model": name or None,
                "memory_mib": number(memory),
                "uuid": uuid if uuid.startswith("GPU-") else None,
                "driver": driver or None,
            }
        )
    return rows


def gpu_numa_node(bus):
    """The NUMA node of the PCI device ``bus`` (-1, the kernel's "none", is None)."""
    node = number(read(f"{PCI_DEVICES}/{bus}/numa_node")) if bus else None
    return node if node is not None and node >= 0 else None


def gpus():
    """The GPUs (nvidia-smi's view where it answers, else the driver's files), where they came from, and the
    driver version nvidia-smi gave. nvidia-smi runs only where the driver's files show GPUs."""
    found = driver_gpus()
    if not found:
        return [], None, None
    smi = parse_smi(run(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"], SMI_TIMEOUT_S))
    rows = smi or [{**g, "index": i, "memory_mib": None} for i, g in enumerate(found)]
    driver = next((r["driver"] for r in rows if r.get("driver")), None)
    for row in rows:
        row.pop("driver", None)
        row["numa_node"] = gpu_numa_node(row["bus_id"])
    return rows, "nvidia-smi" if smi else "driver", driver


def driver_version():
    """The NVIDIA kernel module's version, from /proc/driver/nvidia/version's NVRM line."""
    found = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)", read(f"{DRIVER}/version") or "")
    return found.group(1) if found else None


def affinity():
    """The CPUs this process may run on (what a Slurm step or a taskset left it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 0))


def meminfo():
    """/proc/meminfo's MemTotal and MemAvailable in MiB (each None where absent or garbled; MemAvailable is
    missing before Linux 3.14)."""
    fields = driver_fields(read(MEMINFO))
    kib = [number((fields.get(key) or "").removesuffix("kB").strip()) for key in ("MemTotal", "MemAvailable")]
    return [None if k is None or k < 0 else k >> 10 for k in kib]


def numa_nodes():
    """Each NUMA node and its CPUs (/sys/devices/system/node/node*/cpulist); a node whose list is garbled is
    left out."""
    nodes = []
    for entry in listdir(NODES):
        found = re.fullmatch(r"node([0-9]+)", entry)
        cpus = parse_cpulist(read(f"{NODES}/{entry}/cpulist")) if found else None
        if found and cpus is not None:
            nodes.append({"id": int(found.group(1)), "cpus": format_cpulist(cpus)})
    return sorted(nodes, key=lambda n: n["id"])


def ip_addresses():
    """Interface name -> its addresses as ``address/prefix``, from ``ip -j addr``; None where that fails."""
    try:
        links = json.loads(run(["ip", "-j", "addr", "show"], IP_TIMEOUT_S) or "null")
    except ValueError:
        return None
    if not isinstance(links, list):
        return None
    found = {}
    for link in links:
        if isinstance(link, dict) and isinstance(link.get("ifname"), str):
            infos = [i for i in link.get("addr_info") or [] if isinstance(i, dict)]
            found[link["ifname"]] = [
                f"{i['local']}/{i['prefixlen']}" for i in infos if "local" in i and "prefixlen" in i
            ]
    return found


def ioctl_ipv4(name):
    """The interface's IPv4 address and prefix by ioctl (SIOCGIFADDR, SIOCGIFNETMASK): where there is no ``ip``."""
    import fcntl
    import struct

    request = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            address = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, request)[20:24])
            mask = fcntl.ioctl(s.fileno(), 0x891B, request)[20:24]
    except OSError:
        return []
    return [f"{address}/{bin(int.from_bytes(mask, 'big')).count('1')}"]


def proc_ipv6():
    """Interface name -> its IPv6 addresses with prefix, from /proc/net/if_inet6."""
    found = {}
    for line in (read("/proc/net/if_inet6") or "").splitlines():
        fields = line.split()
        prefix = number(fields[2], lambda t: int(t, 16)) if len(fields) == 6 else None
        try:
            address = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(fields[0])) if prefix is not None else None
        except ValueError:
            address = None
        if address:
            found.setdefault(fields[5], []).append(f"{address}/{prefix}")
    return found


def interface_names():
    names = listdir(NET)
    if names:
        return names
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def interfaces():
    """Every network interface: administratively up (IFF_UP), its operstate, speed and addresses."""
    by_ip = ip_addresses()
    v6 = proc_ipv6() if by_ip is None else {}
    found = []
    for name in interface_names():
        flags = number(read(f"{NET}/{name}/flags"), lambda t: int(t, 16))
        state = read(f"{NET}/{name}/operstate")
        speed = number(read(f"{NET}/{name}/speed"))  # EINVAL without a link; -1 where the driver does not know
        addresses = by_ip.get(name, []) if by_ip is not None else ioctl_ipv4(name) + v6.get(name, [])
        found.append(
            {
                "name": name,
                "up": bool(flags & 1) if flags is not None else state in ("up", "unknown"),
                "state": state or None,
                "speed_mbps": speed if speed is not None and speed > 0 else None,
                "addresses": addresses,
            }
        )
    return found


def default_interface():
    """The device of the IPv4 default route with the lowest metric (/proc/net/route), or None."""
    best = None
    for line in (read("/proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
            metric = number(fields[6])
            if metric is not None and (best is None or metric < best[0]):
                best = (metric, fields[0])
    return best[1] if best else None


def ib_port(device, port):
    state = read(f"{INFINIBAND}/{device}/ports/{port}/state") or ""  # "4: ACTIVE"
    rate = re.match(r"\s*([0-9.]+)\s*Gb/sec", read(f"{INFINIBAND}/{device}/ports/{port}/rate") or "")
    return {
        "port": int(port),
        "state": state.partition(":")[2].strip() or state or None,
        "rate_gbps": number(rate.group(1), float) if rate else None,
        "link_layer": read(f"{INFINIBAND}/{device}/ports/{port}/link_layer") or None,
    }


def ib_devices():
    """Every InfiniBand (or RoCE) device and its ports: state, rate and link layer."""
    return [
        {"name": device, "ports": [ib_port(device, p) for p in listdir(f"{INFINIBAND}/{device}/ports") if p.isdigit()]}
        for device in listdir(INFINIBAND)
    ]


def nccl_version():
    """The version of the NCCL wheel (nvidia-nccl-cu1x) this interpreter sees, from its .dist-info folder's name:
    as importlib.metadata finds it, without the cost of importing that."""
    wanted = [d.replace("-", "_") for d in NCCL_DISTS]
    found = {}
    for folder in sys.path:
        for entry in listdir(folder or "."):
            name, _, rest = entry.partition("-")
            if name.lower() in wanted and rest.endswith(".dist-info"):
                found.setdefault(name.lower(), rest[: -len(".dist-info")])
    return next((found[d] for d in wanted if d in found), None)


def guarded(reader, empty):
    """``reader()``, or ``empty`` if it fails anyway: one fact's surprise must not cost the others (or the
    agent's hello)."""
    try:
        return reader()
    except Exception:
        return empty


def inventory():
    """This host's inventory, as a dict of JSON types (the shape in this module's docstring)."""
    found_gpus, source, smi_driver = guarded(gpus, ([], None, None))
    memory = guarded(meminfo, [None, None])
    return {
        "gpus": found_gpus,
        "gpu_source": source,
        "cpus": os.cpu_count(),
        "affinity": format_cpulist(guarded(affinity, [])),
        "memory_mib": memory[0],
        "memory_available_mib": memory[1],
        "numa_nodes": guarded(numa_nodes, []),
        "interfaces": guarded(interfaces, []),
        "default_interface": guarded(default_interface, None),
        "ib_devices": guarded(ib_devices, []),
        "cuda_driver": guarded(driver_version, None) or smi_driver,
        "nccl": guarded(nccl_version, None),
    }

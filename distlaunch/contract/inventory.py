"""A host's inventory as the launcher reads it: what ``distlaunch.hostprobe`` found on that host (in its agent's
hello, or the doctor's probe), parsed. Decisions that depend on a host's hardware read it from here, never from the
machine the command was typed on."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, PlainSerializer, ValidationError

from distlaunch.hostprobe import format_cpulist, parse_cpulist


def _cpus(value: Any) -> Any:
    """A CPU list as the probe sends it (the kernel's ``0-3,8`` text) or as numbers; garbled text stays text,
    for pydantic to refuse."""
    if isinstance(value, str):
        cpus = parse_cpulist(value)
        return value if cpus is None else cpus
    return value


# A set of CPUs: the kernel's CPU list text on the wire and in JSON, a sorted tuple of numbers here.
CpuList = Annotated[tuple[int, ...], BeforeValidator(_cpus), PlainSerializer(format_cpulist, return_type=str)]


class Gpu(BaseModel):
    """One GPU, by its index as nvidia-smi and CUDA (in PCI order) number it."""

    index: int
    model: str | None = None
    memory_mib: int | None = None  # nvidia-smi's memory.total; None where nvidia-smi did not answer
    bus_id: str | None = None  # as sysfs names it: 0000:18:00.0
    uuid: str | None = None
    numa_node: int | None = None  # the NUMA node of its PCI device; None where the kernel knows none

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_mib is None else self.memory_mib << 20


class NumaNode(BaseModel):
    """A NUMA node and its CPUs."""

    id: int
    cpus: CpuList = ()


class Interface(BaseModel):
    """A network interface and its addresses (``address/prefix``)."""

    name: str
    up: bool = False  # administratively up (IFF_UP)
    state: str | None = None  # the kernel's operstate: up, down, unknown (lo), ...
    speed_mbps: int | None = None
    addresses: list[str] = Field(default_factory=list)

    @property
    def addrs(self) -> list[str]:
        """Its addresses without their prefix lengths."""
        return [a.partition("/")[0] for a in self.addresses]

    def networks(self) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
        """Its addresses with their networks (an address that does not parse is left out)."""
        found = []
        for text in self.addresses:
            try:
                found.append(ipaddress.ip_interface(text))
            except ValueError:
                continue
        return found


class IbPort(BaseModel):
    """A port of an InfiniBand (or RoCE) device."""

    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet (RoCE)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


class IbDevice(BaseModel):
    """An InfiniBand device (an HCA, as NCCL_IB_HCA names it) and its ports."""

    name: str
    ports: list[IbPort] = Field(default_factory=list)


class HostInventory(BaseModel):
    """What one host has: GPUs, CPUs and NUMA nodes, memory, network interfaces, InfiniBand, the NVIDIA driver and
    NCCL. Unknown keys (a newer probe's) are ignored; a key an older probe did not send is None."""

    gpus: list[Gpu] = Field(default_factory=list)
    gpu_source: str | None = None  # nvidia-smi, driver (/proc/driver/nvidia only), None: no GPU found
    cpus: int | None = None  # the host's CPUs (os.cpu_count)
    affinity: CpuList = ()  # the CPUs the probing process may run on (a Slurm step's or taskset's share)
    numa_nodes: list[NumaNode] = Field(default_factory=list)
    memory_mib: int | None = None  # /proc/meminfo's MemTotal
    memory_available_mib: int | None = None  # MemAvailable, when the probe ran
    interfaces: list[Interface] = Field(default_factory=list)
    default_interface: str | None = None  # the IPv4 default route's device
    ib_devices: list[IbDevice] = Field(default_factory=list)
    cuda_driver: str | None = None  # the NVIDIA driver's version (550.54.15)
    nccl: str | None = None  # the nvidia-nccl-cu1x wheel's version, where the probing interpreter has one

    @classmethod
    def of(cls, data: object) -> HostInventory | None:
        """The inventory in ``data`` (a probe's dict); None where there is none, or it is not one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_memory_mib(self) -> int | None:
        """The smallest GPU's memory (what a planner may count on for every rank); None where unknown."""
        known = [g.memory_mib for g in self.gpus if g.memory_mib is not None]
        return min(known) if known and len(known) == len(self.gpus) else None

    def node_cpus(self, node: int) -> tuple[int, ...]:
        """The CPUs of NUMA node ``node`` that the probing process may use; empty for a node it does not know."""
        cpus = next((n.cpus for n in self.numa_nodes if n.id == node), ())
        usable = set(self.affinity)
        return tuple(c for c in cpus if c in usable) if usable else cpus

    def gpu_cpus(self, index: int) -> tuple[int, ...]:
        """The CPUs of GPU ``index``'s NUMA node (usable ones only); empty where its node is unknown."""
        gpu = next((g for g in self.gpus if g.index == index), None)
        return () if gpu is None or gpu.numa_node is None else self.node_cpus(gpu.numa_node)

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def interface_toward(self, address: str) -> Interface | None:
        """The interface this host reaches ``address`` (an IP address) through, as the kernel's main routing
        table would pick it: the one that owns it (the master itself), else the one whose network holds it
        (the longest prefix), else the default route's; None where none is up or the address does not parse."""
        try:
            target = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            return None
        up = [i for i in self.interfaces if i.up]
        owner = next((i for i in up if any(n.ip == target for n in i.networks())), None)
        if owner is not None:
            return owner
        holding = [(n.network.prefixlen, i) for i in up for n in i.networks() if target in n.network]
        if holding:
            return max(holding, key=lambda pair: pair[0])[1]
        default = self.interface(self.default_interface) if self.default_interface and target.version == 4 else None
        return default if default is not None and default.up else None

    def ib_hcas(self) -> list[str]:
        """The InfiniBand devices with an active port, as ``device:port`` (NCCL_IB_HCA's spelling)."""
        return [f"{d.name}:{p.port}" for d in self.ib_devices for p in d.ports if p.active]

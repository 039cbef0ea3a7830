"""Checks of one host's software and hardware: pure functions from the probe's facts to findings."""

from __future__ import annotations

import ipaddress

from distlaunch.doctor.model import Check, HostFacts, check
from distlaunch.readable import plural

GIB = 1 << 30
SHM_MIN_BYTES = 1 * GIB  # below this, DataLoader workers and NCCL's shared-memory transport die with SIGBUS


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _mib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def python_check(host: str, facts: HostFacts, reference: HostFacts | None, local_version: str | None) -> Check:
    """The interpreter ran the probe; distlaunch is importable there (remote ranks start its agent)."""
    py = facts.python
    if facts.distlaunch is None:
        return check(
            "python",
            host,
            "fail",
            f"{py['executable']} (Python {py['version']}) cannot import distlaunch: "
            f"the launcher starts 'python -m distlaunch.agent' on every host",
            f"on {host}: {py['executable']} -m pip install distlaunch{'==' + local_version if local_version else ''}, "
            f"or pass --remote-python with an interpreter that has it",
        )
    if reference is not None and reference.python["version"].split(".")[:2] != py["version"].split(".")[:2]:
        return check(
            "python",
            host,
            "warn",
            f"Python {py['version']} here but {reference.python['version']} on the master",
            "use the same Python minor version everywhere (pickled objects and wheels differ between them)",
        )
    if local_version and facts.distlaunch != local_version:
        return check(
            "python",
            host,
            "warn",
            f"distlaunch {facts.distlaunch} on {host}, {local_version} here",
            f"install the same version on every host: pip install distlaunch=={local_version}",
        )
    return check("python", host, "pass", f"{py['executable']} (Python {py['version']}, distlaunch {facts.distlaunch})")


def workdir_check(host: str, facts: HostFacts) -> Check:
    """The ranks' working directory (--workdir, else the launcher's current folder) is a folder there."""
    found = facts.workdir
    if found is None:
        return check("workdir", host, "skip", "not asked")
    if found["problem"] is None:
        return check("workdir", host, "pass", f"{found['path']} (where the ranks start)")
    return check(
        "workdir",
        host,
        "fail",
        f"{found['path']} {found['problem']} on {host}: the ranks start there",
        f"create it on {host} (the same path on every host: a shared file system, or a copy), or pass --workdir",
    )


def torch_check(
    host: str, facts: HostFacts, reference: HostFacts | None, is_master: bool, flag: str = "--remote-python"
) -> Check:
    """torch is installed and its version and CUDA build equal the master's (``flag``: the option that names the
    interpreter judged)."""
    py = facts.python["executable"]
    torch = facts.torch
    ref = reference.torch if reference is not None else None
    if torch is None:
        want = f"torch=={ref['version']}" if ref else "torch"
        return check(
            "torch-version",
            host,
            "fail",
            f"torch is not installed for {py}",
            f"on {host}: {py} -m pip install {want}, or pass {flag} with the interpreter that has torch",
        )
    what = f"torch {torch['version']}" + (f", CUDA {torch['cuda']}" if torch.get("cuda") else ", CPU build")
    if is_master or ref is None:
        return check("torch-version", host, "pass", what + (" (the reference: master)" if is_master else ""))
    for key, label in (("version", "torch"), ("cuda", "CUDA")):
        if torch.get(key) != ref.get(key):
            return check(
                "torch-version",
                host,
                "fail",
                f"{label} {torch.get(key) or 'none'} here but {ref.get(key) or 'none'} "
                "on the master: collectives between mismatched builds hang or crash",
                f"on {host}: {py} -m pip install torch=={ref['version']} (the same wheel as the master)",
            )
    return check("torch-version", host, "pass", what + " (same as master)")


def nccl_check(host: str, facts: HostFacts, reference: HostFacts | None) -> Check:
    """Where GPUs exist, torch is a CUDA build with NCCL, of the master's NCCL version."""
    if facts.gpu_count == 0:
        return check("nccl", host, "skip", "no GPUs: ranks use gloo on CPU, NCCL is not needed")
    torch = facts.torch
    if torch is None:
        return check("nccl", host, "skip", "torch is not installed (see torch-version)")
    if not torch.get("cuda"):
        return check(
            "nccl",
            host,
            "fail",
            f"{plural(facts.gpu_count, 'GPU')} but torch {torch['version']} is a CPU-only build",
            "install a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cu124)",
        )
    if not torch.get("nccl"):
        return check(
            "nccl",
            host,
            "fail",
            f"torch {torch['version']} (CUDA {torch['cuda']}) has no NCCL library",
            "reinstall torch from the official CUDA wheels, which bring nvidia-nccl-cu*",
        )
    ref = reference.torch if reference is not None and reference.torch else None
    if ref and ref.get("nccl") and ref["nccl"] != torch["nccl"]:
        return check(
            "nccl",
            host,
            "fail",
            f"NCCL {torch['nccl']} here but {ref['nccl']} on the master",
            "install the same torch and nvidia-nccl-cu* versions on every host",
        )
    return check("nccl", host, "pass", f"NCCL {torch['nccl']} with CUDA {torch['cuda']}")


def gpus_check(host: str, facts: HostFacts, slots: int, explicit_slots: bool, any_gpus: bool) -> Check:
    """GPUs found against the slots the hostfile gives the host; no GPUs means CPU ranks with gloo."""
    count = facts.gpu_count
    if count == 0:
        if any_gpus:
            return check(
                "gpus",
                host,
                "fail",
                "no GPUs found, but other hosts have GPUs: one job cannot mix NCCL and CPU ranks",
                "install the NVIDIA driver here (nvidia-smi must work), or leave this host out (--exclude)",
            )
        return check(
            "gpus", host, "pass", f"no GPUs (nvidia-smi/driver not found): {plural(slots, 'rank')} on CPU with gloo"
        )
    names = sorted({g.model or "unknown model" for g in facts.inventory.gpus})
    found = f"{plural(count, 'GPU')} ({', '.join(names)}) via {facts.inventory.gpu_source}"
    if explicit_slots and slots > count:
        return check(
            "gpus",
            host,
            "fail",
            f"slots={slots} but only {found}: ranks would share GPUs",
            f"set slots={count} for {host} in the hostfile",
        )
    return check("gpus", host, "pass", f"{found}; {plural(slots, 'slot')} used")


def shm_check(host: str, facts: HostFacts) -> Check:
    """/dev/shm of at least 1 GiB (containers default to 64 MiB: the classic bus error, signal 7)."""
    if facts.shm_bytes is None:
        return check(
            "shm",
            host,
            "warn",
            "/dev/shm does not exist: DataLoader workers and NCCL's SHM transport need it",
            "mount a tmpfs on /dev/shm (docker: --shm-size=8g or --ipc=host)",
        )
    if facts.shm_bytes < SHM_MIN_BYTES:
        return check(
            "shm",
            host,
            "warn",
            f"/dev/shm is {_mib(facts.shm_bytes)}: DataLoader workers and NCCL die with "
            "'bus error' (signal 7) when it fills",
            "docker: --shm-size=8g or --ipc=host; k8s: an emptyDir with medium: Memory",
        )
    return check("shm", host, "pass", f"/dev/shm is {_mib(facts.shm_bytes)}")


def memlock_check(host: str, facts: HostFacts) -> Check:
    """With InfiniBand, NCCL pins memory: the locked-memory limit must be unlimited (or very large)."""
    limit = "unlimited" if facts.memlock < 0 else _mib(facts.memlock)
    if not facts.infiniband:
        return check("memlock", host, "pass", f"no InfiniBand devices; memlock limit {limit} does not matter")
    if facts.memlock >= 0:
        return check(
            "memlock",
            host,
            "warn",
            f"InfiniBand ({', '.join(facts.infiniband)}) but the memlock limit of an SSH "
            f"session is {limit}: NCCL's ibv_reg_mr fails and it falls back to slow sockets or aborts",
            "set '* - memlock unlimited' in /etc/security/limits.conf (and UsePAM yes in sshd_config), then log in again",
        )
    return check("memlock", host, "pass", f"InfiniBand ({', '.join(facts.infiniband)}), memlock unlimited")

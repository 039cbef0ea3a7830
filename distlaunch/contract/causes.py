"""Plain words for the rank failures whose tracebacks users meet most, read from the last lines a rank
printed (or its ``@record`` error): what happened, where, and what to do. A failure matching none of
them is shown as its output alone.
"""

from __future__ import annotations

import re

# torch's TCPStore server (rank 0) and client (every rank) errors, as c10d words them
_STORE_PORT_IN_USE = re.compile(
    r"server socket has failed to listen on any local network address\..*?port: (\d+).*?EADDRINUSE"
)
_STORE_UNREACHABLE = re.compile(
    r"client socket has timed out after (\d+)ms while trying to connect to \(([^,)]+), (\d+)\)"
)
_HOST_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")
# torch's CUDA caching allocator (torch.OutOfMemoryError); older releases put the GPU in parentheses
_GPU_MEMORY = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)")
_GPU_CAPACITY = re.compile(r"GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ \w+) is free")
# a collective whose peers never came: NCCL's watchdog (it then aborts the process) and gloo's transport
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)[^)]*?Timeout\(ms\)=(\d+)\)"
)
_GLOO_TIMEOUT = re.compile(r"gloo/transport/\S+\] Timed out waiting (\d+)ms for (?:send|recv) operation to complete")
# two ranks on one GPU (NCCL refuses them), or a rank past the host's last GPU (CUDA's own words)
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device")
_NO_SUCH_GPU = re.compile(r"CUDA error: invalid device ordinal")
_ONE_GPU_PER_RANK = (
    "each rank should use GPU LOCAL_RANK (torch.cuda.set_device(int(os.environ['LOCAL_RANK']))), and a host should "
    "start at most as many ranks as it shows GPUs (-n, the hostfile's slots; CUDA_VISIBLE_DEVICES)"
)
_LESS_PER_RANK = (
    "a smaller micro-batch, activation checkpointing, or more sharding (ZeRO, tp, pp) lowers what each rank holds"
)


def explain(text: str, host: str) -> str | None:
    """One line for a known failure in a rank's ``text`` on ``host``, else None."""
    if match := _STORE_PORT_IN_USE.search(text):
        port = match[1]
        return (
            f"the rendezvous store could not start: port {port} is already in use on {host} (MASTER_PORT); "
            "pick another --master-port, or leave it auto (a free port outside the range outgoing connections use)"
        )
    if match := _STORE_UNREACHABLE.search(text):
        seconds, addr, port = int(match[1]) / 1000, match[2], match[3]
        return (
            f"could not reach the rendezvous store at {addr}:{port} in {seconds:g}s from {host}: rank 0 never "
            "started it, or the network between them drops the connection; 'distlaunch doctor' with the same "
            "hosts checks name resolution, routes and the port"
        )
    if match := _HOST_MEMORY.search(text):
        gib = int(match[1]) / 2**30
        return (
            f"out of host memory on {host}: an allocation of {gib:,.1f} GiB failed; fewer ranks per host, or "
            f"{_LESS_PER_RANK}"
        )
    if (nccl := _NCCL_TIMEOUT.search(text)) or (gloo := _GLOO_TIMEOUT.search(text)):
        seconds, what = (int(nccl[3]), f"{nccl[2]} #{nccl[1]}, NCCL") if nccl else (int(gloo[1]), "gloo")
        return (
            f"a collective timed out after {seconds / 1000:g}s on {host} ({what}), waiting for a rank that never "
            "reached it: that rank (it hangs, is stuck in other code, or died) is the root cause, not this one; "
            "a --hang-timeout shorter than the collective timeout gathers every rank's stack before it fires"
        )
    if match := _DUPLICATE_GPU.search(text):
        first, second = sorted(int(rank) for rank in match.groups())
        return f"ranks {first} and {second} use the same GPU on {host}, which NCCL refuses; {_ONE_GPU_PER_RANK}"
    if _NO_SUCH_GPU.search(text):
        return f"a rank asked for a GPU that {host} does not show (invalid device ordinal); {_ONE_GPU_PER_RANK}"
    if match := _GPU_MEMORY.search(text):
        gpu = _GPU_CAPACITY.search(text)
        where = f" (GPU {gpu[1]}: {gpu[3]} free of {gpu[2]})" if gpu else ""
        return (
            f"out of GPU memory on {host}{where}: an allocation of {match[1]} failed; {_LESS_PER_RANK} "
            "('distlaunch train --dry-run' prints each rank's planned peak)"
        )
    return None

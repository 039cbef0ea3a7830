"""A rank failure users meet often is named in plain words under the failure table, and in the JSON
report; real ranks, real torch errors."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

SCRIPTS = {
    # an outgoing connection takes MASTER_PORT between the launcher's check and rank 0's store
    "port-taken": (
        "import os, socket\n"
        "import torch.distributed as dist\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "if os.environ['RANK'] == '0':\n"
        "    taker = socket.socket()\n"
        "    taker.bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\n"
        "    taker.connect(server.getsockname())\n"
        "dist.init_process_group('gloo')\n"
    ),
    # the master never starts its store; rank 1 gives up after 2 s
    "store-unreachable": (
        "import datetime, os, sys\n"
        "import torch.distributed as dist\n"
        "if os.environ['RANK'] == '0':\n"
        "    sys.exit(0)\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=2))\n"
    ),
    "host-memory": "import os, torch\nif os.environ['RANK'] == '1':\n    torch.empty(2**44, dtype=torch.uint8)\n",
    # rank 0 is late for the all-reduce (slow data, a hang): rank 1's gloo gives up after 2 s and fails first
    "collective-timeout": (
        "import datetime, os, time\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=2))\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(60)\n"
        "dist.all_reduce(torch.ones(1))\n"
    ),
    # NCCL's watchdog logs this, then aborts the process; no GPU here, so the rank does the same by hand
    "nccl-watchdog": (
        "import os, sys\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('[rank1]:[E1127 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=78, OpType=ALLREDUCE, NumelIn=80, NumelOut=80, Timeout(ms)=600000)"
        " ran for 600096 milliseconds before timing out.', file=sys.stderr, flush=True)\n"
        "    os.abort()\n"
    ),
    # torchrun's classic mistakes on a host with fewer GPUs than ranks, as torch words them (no GPU in this suite):
    # every rank on cuda:0 (NCCL's init refuses the duplicate), or rank 1 asking for a GPU the host lacks
    "duplicate-gpu": (
        "import os\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage"
        " (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\\nncclInvalidUsage: This usually reflects"
        " invalid usage of NCCL library.\\nLast error:\\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA"
        " device 18000')\n"
    ),
    "no-such-gpu": (
        "import os\n"
        "if os.environ['RANK'] == '1':\n"
        "    import torch\n"
        "    raise torch.AcceleratorError('CUDA error: invalid device ordinal\\nGPU device may be out of range, do"
        " you have enough GPUs?\\nCUDA kernel errors might be asynchronously reported at some other API call, so"
        " the stacktrace below might be incorrect.\\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1')\n"
    ),
    # This suite has no GPU: the rank raises what torch's CUDA caching allocator raises, worded as it words it
    # (torch 2.x; a 1.3b job at twice the batch that fits an 80 GB H100)
    "gpu-memory": (
        "import os\n"
        "if os.environ['RANK'] == '1':\n"
        "    import torch\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 3.07 GiB. GPU 1 has a total capacity"
        " of 79.19 GiB of which 1.41 GiB is free. Including non-PyTorch memory, this process has 77.77 GiB memory in"
        " use. Of the allocated memory 75.12 GiB is allocated by PyTorch, and 1.96 GiB is reserved by PyTorch but"
        " unallocated. If reserved but unallocated memory is large try setting"
        " PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.')\n"
    ),
}
CAUSES = {
    "port-taken": (0, "the rendezvous store could not start: port {port} is already in use on localhost"),
    "store-unreachable": (1, "could not reach the rendezvous store at 127.0.0.1:{port} in 2s from localhost"),
    "host-memory": (1, "out of host memory on localhost: an allocation of 16,384.0 GiB failed"),
    "collective-timeout": (
        1,
        "a collective timed out after 2s on localhost (gloo), waiting for a rank that never reached it: that rank "
        "(it hangs, is stuck in other code, or died) is the root cause, not this one; a --hang-timeout shorter than "
        "the collective timeout gathers every rank's stack before it fires",
    ),
    "nccl-watchdog": (1, "a collective timed out after 600s on localhost (ALLREDUCE #78, NCCL), waiting for a rank"),
    "duplicate-gpu": (
        1,
        "ranks 0 and 1 use the same GPU on localhost, which NCCL refuses; each rank should use GPU LOCAL_RANK "
        "(torch.cuda.set_device(int(os.environ['LOCAL_RANK']))), and a host should start at most as many ranks as it "
        "shows GPUs (-n, the hostfile's slots; CUDA_VISIBLE_DEVICES)",
    ),
    "no-such-gpu": (1, "a rank asked for a GPU that localhost does not show (invalid device ordinal); each rank"),
    "gpu-memory": (
        1,
        "out of GPU memory on localhost (GPU 1: 1.41 GiB free of 79.19 GiB): an allocation of 3.07 GiB failed; a "
        "smaller micro-batch, activation checkpointing, or more sharding (ZeRO, tp, pp) lowers what each rank holds "
        "('distlaunch train --dry-run' prints each rank's planned peak)",
    ),
}


@pytest.mark.parametrize("case", list(SCRIPTS))
def test_a_known_failure_is_named_in_plain_words(case, tmp_path):
    script = tmp_path / f"{case}.py"
    script.write_text(SCRIPTS[case])
    r = run_cli("run", "-n", "2", "--json", str(script), timeout=120)
    assert r.returncode == (134 if case == "nccl-watchdog" else 1), r.stdout + r.stderr  # 128 + SIGABRT
    report = json.loads(r.stdout)
    rank, words = CAUSES[case]
    (failure,) = [f for f in report["failures"] if f["rank"] == rank]
    expected = words.format(port=report_port(r.stderr))
    assert failure["cause"].startswith(expected), failure
    if case == "host-memory":  # and under the table, beside the rank's own output (one case: a launch each)
        shown = run_cli("run", "-n", "2", str(script), timeout=120)
        assert f"cause (rank 1): {expected}" in shown.stderr.replace("\n", " "), shown.stderr
        assert "[rank 1] Traceback" in shown.stderr


def report_port(stderr: str) -> str:
    """The MASTER_PORT the job used, as its own ranks' torch errors name it."""
    for marker in ("port: ", "127.0.0.1, "):
        if marker in stderr:
            return stderr.split(marker, 1)[1].split(",")[0].split(")")[0]
    return "?"


def test_an_unknown_failure_has_no_cause(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('learning rate must be positive')\n")
    r = run_cli("run", "-n", "1", "--json", str(script), timeout=60)
    assert r.returncode == 1 and json.loads(r.stdout)["failures"][0]["cause"] is None
    shown = run_cli("run", "-n", "1", str(script), timeout=60)
    assert "learning rate must be positive" in shown.stderr and "cause (" not in shown.stderr

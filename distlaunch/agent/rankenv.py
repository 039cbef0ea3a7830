"""What the agent adds to each rank's environment: the files through which a rank and its agent talk (its progress
report, its save requests, its stacks) and, under a hang watch, where NCCL's flight recorder dumps.

They all lie in the agent's scratch folder, which the agent makes on its host when it starts. The launcher's plan
shows them the same way, from these functions, naming that folder ``<scratch>`` (``SCRATCH_MARK``); the agent puts
its folder in the mark's place (``in_scratch``), then sets them as its host has them.

Standard library only, as the whole agent.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from distlaunch import protocol as p
from distlaunch.agent.scratch import PROGRESS, REQUEST, STACKS, rank_file
from distlaunch.startcheck import is_python

SCRATCH_MARK = "<scratch>"  # the agent's scratch folder, as a plan names it: it exists only once the agent runs
# Python ranks start through distlaunch/rankboot.py, which arms faulthandler on this signal (a real-time one:
# no program uses it by accident) and a per-rank file in the agent's scratch folder.
STACKS_SIGNAL = signal.SIGRTMIN + 5
# PyTorch's NCCL watchdog makes a pipe <stem><global rank>.pipe when TORCH_NCCL_DEBUG_INFO_PIPE_FILE names a
# stem, polls it about once a second and dumps its flight recorder when anything is written to it: how a
# hang gets its dumps long before NCCL's own collective timeout would write them.
NCCL_DUMP_PIPE_STEM = "nccl_dump_pipe_rank"
FLIGHT_RECORDER_VARS = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)


def rank_vars(rank: int, argv: list[str], scratch: str) -> dict[str, str]:
    """A rank's own files: its progress report and its save requests (every rank), and its stacks file and
    signal (a Python rank: rankboot arms faulthandler with them and takes both out before the program runs)."""
    env = {
        "DISTLAUNCH_PROGRESS_FILE": rank_file(scratch, rank, PROGRESS),
        "DISTLAUNCH_REQUEST_FILE": rank_file(scratch, rank, REQUEST),
    }
    if is_python(argv):
        env["DISTLAUNCH_STACKS_FILE"] = rank_file(scratch, rank, STACKS)
        env["DISTLAUNCH_STACKS_SIGNAL"] = str(int(STACKS_SIGNAL))
    return env


def flight_recorder_vars(scratch: str, environ: Mapping[str, str]) -> dict[str, str]:
    """PyTorch's NCCL flight recorder on, dumping into the scratch folder, for a job with a hang watch: what of it
    ``environ`` (the rank's environment so far) does not set already. Inert without NCCL."""
    # Its current names, torch >= 2.6 (setting the older aliases too makes every rank print a deprecation
    # warning): recorded collectives, dumped per rank into the scratch folder on a collective timeout. The
    # dumps are sent to the launcher at the agent's end, before the scratch folder goes.
    values = ("2000", "1", os.path.join(scratch, p.NCCL_TRACE_PREFIX), os.path.join(scratch, NCCL_DUMP_PIPE_STEM))
    return {name: value for name, value in zip(FLIGHT_RECORDER_VARS, values, strict=True) if name not in environ}


def in_scratch(env: Mapping[str, str], scratch: str) -> dict[str, str]:
    """A plan's variables with this agent's scratch folder in the place of ``SCRATCH_MARK``."""
    return {k: scratch + v[len(SCRATCH_MARK) :] if v.startswith(SCRATCH_MARK) else v for k, v in env.items()}

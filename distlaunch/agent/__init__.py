"""The per-node agent: ``python -m distlaunch.agent``.

The launcher starts one agent per node (a local subprocess, or a command over SSH) and writes the
node's part of the plan to its stdin as one JSON line. The agent starts the node's ranks, each in
its own process group, reports on stdout and obeys commands on stdin, in the protocol of
distlaunch/protocol.py. When stdin closes (the launcher died, the SSH connection dropped) the agent
stops its ranks by itself, with the grace period capped at 3 s: that is what keeps a SIGKILLed
launcher from leaving ranks behind. Only the process groups this agent created are ever signalled.

Standard library only: it runs on remote hosts with whatever Python they have, from the floor in
distlaunch/protocol.py (PYTHON_FLOOR) on (an older one is refused in one line), and it must start fast.
It may import distlaunch.protocol, distlaunch.files and distlaunch.startcheck, nothing else of distlaunch
(pyproject.toml's import contracts check it).

core.py is the supervision loop: start the ranks, obey the launcher's commands, report the ranks' exits. Each
other concern is a collaborator with a narrow interface:

- processes.py, ``RankProcesses``: the ranks' process groups: their exits stamped (``observe_exits``), signalled
  (``signal_all``), the stop and its grace period (``begin_stop``, ``kill``, ``overdue``).

- channel.py, ``Events``: events to the launcher, never blocking (``emit``, ``flush``, ``drain``), and
  ``Lines``: the plan and commands from it.
- output.py, ``RankOutput``: the ranks' pipes as ``out`` events (``watch``, ``read``, ``pause``, ``finished``).
- liveness.py, ``Heartbeat`` (``heard``, ``check``) and ``Progress`` (``check``).
- diagnosis.py, ``Stacks`` (``send``) and ``FlightRecorder`` (``ask``, ``wait``, ``send``).
- ranks.py: one rank's start (argv, environment, start errors) and end (exit descriptor, error file).
- strays.py: the processes ranks leave outside their groups; scratch.py: the agent's scratch folder.
- rankenv.py: what the agent adds to a rank's environment (its files in the scratch folder, the flight
  recorder's), in pure functions: ``Agent.rank_env`` sets them, the launcher's plan shows them.

A collaborator that looks at the ranks every turn of the loop is called from ``Agent.step``.
"""

from distlaunch.agent.channel import OUT_PENDING_BYTES, Events, Lines, select_write
from distlaunch.agent.core import Agent, main
from distlaunch.agent.diagnosis import (
    NCCL_DUMP_WAIT_S,
    PYSPY_TIMEOUT_S,
    STACKS_MAX_BYTES,
    STACKS_WAIT_S,
    FlightRecorder,
    Stacks,
)
from distlaunch.agent.liveness import PROGRESS_POLL_S, Heartbeat, Progress
from distlaunch.agent.output import MAX_LINE_BYTES, SPLIT_MARK, RankOutput
from distlaunch.agent.processes import EXITED, RankProcesses
from distlaunch.agent.rankenv import NCCL_DUMP_PIPE_STEM, SCRATCH_MARK, STACKS_SIGNAL
from distlaunch.agent.ranks import RANKBOOT, Rank, die_with_parent, read_error_file
from distlaunch.agent.scratch import SCRATCH_PREFIX, SCRATCH_SWEEP_AGE_S, make_scratch, sweep_scratch
from distlaunch.agent.strays import end_stragglers, is_running

__all__ = [
    "EXITED",
    "MAX_LINE_BYTES",
    "NCCL_DUMP_PIPE_STEM",
    "NCCL_DUMP_WAIT_S",
    "OUT_PENDING_BYTES",
    "PROGRESS_POLL_S",
    "PYSPY_TIMEOUT_S",
    "RANKBOOT",
    "SCRATCH_MARK",
    "SCRATCH_PREFIX",
    "SCRATCH_SWEEP_AGE_S",
    "SPLIT_MARK",
    "STACKS_MAX_BYTES",
    "STACKS_SIGNAL",
    "STACKS_WAIT_S",
    "Agent",
    "Events",
    "FlightRecorder",
    "Heartbeat",
    "Lines",
    "Progress",
    "Rank",
    "RankOutput",
    "RankProcesses",
    "Stacks",
    "die_with_parent",
    "end_stragglers",
    "is_running",
    "main",
    "make_scratch",
    "read_error_file",
    "select_write",
    "sweep_scratch",
]

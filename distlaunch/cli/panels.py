"""The panels a command's ``--help`` groups its options in (an option's ``rich_help_panel``), in the order they are
shown: what a person looks for first comes first. Declared here, apart from how help is drawn (helppage.py), so
that an option's module names its panel without importing rich."""

from __future__ import annotations

# A panel not named in PANELS comes after them, OTHER (--help, a command's own options) last.
ARGUMENTS = "Arguments"
HOSTS = "Hosts and ranks"
LAYOUT = "Layout"
RUN = "The run"
PLANNER = "The planner's inputs"
FAULTS = "Faults and restarts"
OUTPUT = "Output"
CONNECT = "Reaching the hosts"
PER_NODE = "Per-node mode (one distlaunch run per node, as torchrun)"
COMMANDS = "Commands"
OTHER = "Options"
PANELS = (ARGUMENTS, COMMANDS, HOSTS, LAYOUT, RUN, PLANNER, FAULTS, OUTPUT, CONNECT, PER_NODE)
# the options people reach for most: first in their panel, so that they are on a command's first screen
MOST_USED = ("--hostfile", "--nproc-per-node", "--parallel", "--set", "--dry-run")


def panel_rank(panel: str) -> int:
    """Where ``panel`` comes in a command's help: PANELS in order, then any other, then OTHER."""
    if panel in PANELS:
        return PANELS.index(panel)
    return len(PANELS) + (panel == OTHER)

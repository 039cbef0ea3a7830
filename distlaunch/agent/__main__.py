"""``python -m distlaunch.agent``: the per-node agent (see distlaunch/agent/__init__.py)."""

import sys

from distlaunch.agent.core import main
from distlaunch.protocol import python_refusal

if __name__ == "__main__":
    # On a Python older than the floor: one line (exit 1), which the launcher gives as that host's reason.
    sys.exit(python_refusal("agent") or main())

"""``python -m distlaunch.agent``: the per-node agent (see distlaunch/agent/__init__.py)."""

import sys

from distlaunch.agent.core import main

if __name__ == "__main__":
    sys.exit(main())

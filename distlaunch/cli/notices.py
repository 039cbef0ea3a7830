"""Where library code's notices reach the user.

Library code never prints: it logs to the ``distlaunch`` logger (``logging.getLogger("distlaunch")``), and
this handler, installed by every command, writes each notice as one ``distlaunch: ...`` line on stderr.
``-v`` adds the debug notices, ``-q`` keeps only warnings and errors.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "distlaunch"


class _Stderr(logging.Handler):
    """One line per notice on the stderr of the moment (a test's runner swaps it), flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"distlaunch: {record.getMessage()}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or broken stderr costs the notice, never the job
            pass


def install(verbose: bool = False, quiet: bool = False) -> None:
    """Route the ``distlaunch`` logger's notices to stderr at the level the command line asked for."""
    logger = logging.getLogger(LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(handler)
    logger.addHandler(_Stderr())
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)

"""``python -m distlaunch`` is the ``distlaunch`` command."""

from distlaunch.cli.app import entry

entry()

"""What environment remote ranks get beyond the plan's own variables. Never the launcher's whole
environment (it holds this machine's paths and secrets): only well-known tuning variables, the
``.distlaunch_env`` files and ``--env``, in that order of precedence (later wins)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from distlaunch.errors import UsageError
from distlaunch.files import os_error_words, read_settings

ENV_FILE = ".distlaunch_env"
# Tuning knobs of the communication libraries and of torch itself, which users set once and expect on every rank.
FORWARD_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "PYTHON", "TORCH_")
FORWARD_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# These describe this machine, not the job: a remote host has its own GPUs and its own Python install.
NEVER_FORWARD = ("CUDA_VISIBLE_DEVICES", "PYTHONHOME", "PYTHONEXECUTABLE")
# Variables that choose which code a process loads: set by a .distlaunch_env in the working directory, they
# draw a warning (such a file may come with a checked-out repository).
CODE_PATH_NAMES = ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH")


def is_env_name(name: str) -> bool:
    """A portable environment variable name: letters, digits and _, not starting with a digit."""
    return bool(name) and name.replace("_", "a").isalnum() and name.isascii() and not name[0].isdigit()


def forwarded_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The launcher's variables that remote ranks get by default (NCCL_*, GLOO_*, CUDA_*, PYTHON*, TORCH_*, …)."""
    return {
        k: v
        for k, v in environ.items()
        if (k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES) and k not in NEVER_FORWARD
    }


def parse_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` allowed, one pair of surrounding quotes removed), ``#`` comments, blank lines."""
    try:
        text = read_settings(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"env file {str(path)!r} cannot be read: {os_error_words(exc)}", "make it a readable UTF-8 text file"
        ) from None
    env = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not eq or not is_env_name(key):
            raise UsageError(
                f"env file {str(path)!r} line {lineno} {raw.strip()!r} is not KEY=VALUE",
                "write one NAME=value per line (NAME: letters, digits, _); # starts a comment line",
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def env_files(cwd: Path | None = None, home: Path | None = None) -> list[Path]:
    """The ``.distlaunch_env`` files that exist: ``~/`` first, then the working directory (which wins)."""
    found = []
    for folder in (home or Path.home(), cwd or Path.cwd()):
        path = folder / ENV_FILE
        if path.is_file() and path not in found:
            found.append(path)
    return found


def file_env(
    cwd: Path | None = None, home: Path | None = None, announce: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The variables of every ``.distlaunch_env`` file, the working directory's overriding home's.

    ``announce`` gets one line naming the working directory's file and its variables (a file there
    may come with a cloned repository rather than from you), and a warning when it sets a variable
    that changes which code runs (PYTHONPATH, LD_PRELOAD, LD_LIBRARY_PATH).
    """
    env: dict[str, str] = {}
    here = (cwd or Path.cwd()) / ENV_FILE
    for path in env_files(cwd, home):
        values = parse_env_file(path)
        if announce is not None and path == here:
            announce(f"using {path}: {', '.join(values) or 'no variables'}")
            risky = [name for name in values if name in CODE_PATH_NAMES]
            if risky:
                announce(
                    f"distlaunch: warning: {path} sets {', '.join(risky)}, which decide what code every rank "
                    "loads; remove it from the file unless you put it there"
                )
        env.update(values)
    return env

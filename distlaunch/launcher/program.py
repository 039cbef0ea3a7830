"""What every rank runs: the command line built from PROGRAM (a script, ``-m MODULE``, an executable), and
the checks that can catch a wrong program before any rank starts, where the ranks start.

Relative paths are the ranks' own: they start in the working directory (``--workdir``, else the
launcher's), so a script is looked for there, not where the launcher was started.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError

_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?")


def is_interpreter(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` or a path to one: the user named the interpreter themselves."""
    return bool(_INTERPRETER.fullmatch(Path(program).name))


def in_workdir(path: str, workdir: str | None) -> Path:
    """``path`` as a rank sees it from its working directory (an absolute path stays as it is)."""
    return Path(workdir or os.getcwd()) / path


def foreign_shebang(program: str, workdir: str | None = None) -> bool:
    """A script whose ``#!`` line names something other than Python (bash, a wrapper): it runs directly."""
    try:
        with open(in_workdir(program, workdir), "rb") as f:
            head = f.readline(512)
    except OSError:
        return False
    return head.startswith(b"#!") and b"python" not in head


def runs_directly(opts: LaunchOptions, workdir: str | None = None) -> bool:
    """True when PROGRAM is executed as given (as --no-python), not handed to the Python interpreter."""
    if opts.no_python:
        return True
    if opts.module or not opts.program:
        return False
    return is_interpreter(opts.program[0]) or foreign_shebang(opts.program[0], workdir)


def script_of(opts: LaunchOptions) -> str | None:
    """The script file a run starts, when there is one to check (not a module, not a bare executable)."""
    if opts.module or opts.no_python or not opts.program:
        return None
    if is_interpreter(opts.program[0]):
        rest = opts.program[1:]
        return rest[0] if rest and not rest[0].startswith("-") else None
    return opts.program[0]


def build_command(opts: LaunchOptions, workdir: str | None = None) -> list[str]:
    """The argv every rank runs."""
    if not opts.program:
        raise UsageError("no script given", "write: distlaunch run [OPTIONS] script.py [ARGS] (or -m module)")
    if runs_directly(opts, workdir):
        argv = list(opts.program)
        if not opts.no_python and foreign_shebang(argv[0], workdir) and "/" not in argv[0]:
            argv[0] = f"./{argv[0]}"  # the script in the working directory, as given, not a command on PATH
        return argv
    if opts.module:
        return [opts.python, "-m", *opts.program]
    return [opts.python, *opts.program]


def check_script(
    opts: LaunchOptions, where: str = "", hint: str = "check the path, or use -m MODULE", workdir: str | None = None
) -> None:
    """A missing script is one clear error before anything starts, not N identical rank failures. Call it
    where the ranks will start (this machine; an srun task; the submit directory of a batch job)."""
    script = script_of(opts)
    if script is None:
        return
    path = in_workdir(script, workdir)
    if not path.exists():
        seen_from = f" (ranks start in {workdir})" if workdir and not Path(script).is_absolute() else ""
        raise UsageError(f"script {script!r} does not exist{where}{seen_from}", hint)
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise UsageError(
            f"script {script!r} is a directory without a __main__.py{where}",
            "give the script file inside it, or run a package with -m PACKAGE",
        )
    if foreign_shebang(script, workdir) and not os.access(path, os.X_OK):
        raise UsageError(
            f"script {script!r} starts with #! but is not executable{where}",
            f"chmod +x {script}, or name its interpreter: distlaunch run --no-python bash {script}",
        )


def check_workdir(workdir: str) -> None:
    """Ranks that start on this machine start in ``workdir``: it must be a folder here."""
    if Path(workdir).is_dir():
        return
    what = "is not a directory" if Path(workdir).exists() else "does not exist"
    raise UsageError(
        f"working directory {workdir!r} {what}",
        "give --workdir an existing directory (without it, ranks start in the current directory)",
    )


def check_local_program(opts: LaunchOptions, workdir: str) -> None:
    """Where every rank starts on this machine: the working directory, the ranks' Python and the program,
    each refused in one line (exit 2) instead of failing on every rank."""
    check_workdir(workdir)
    if not runs_directly(opts, workdir) and shutil.which(opts.python) is None:
        raise UsageError(
            f"--python {opts.python!r} is not an executable on this machine",
            "give the path of the Python that runs the ranks, or leave --python out (the launcher's own)",
        )
    check_script(opts, workdir=workdir)
    if opts.module and opts.program and opts.python == sys.executable:
        check_module(opts.program[0], workdir)


def check_module(module: str, workdir: str) -> None:
    """``-m MODULE`` with the launcher's own Python: its top-level package must be importable from the
    ranks' working directory (found, not imported: importing could run anything, torch included)."""
    top = module.split(".")[0]
    sys.path.insert(0, workdir)  # as python -m: the working directory comes first
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.remove(workdir)
    if not found:
        raise UsageError(
            f"no module named {top!r} for -m {module} (looked in {workdir} and this Python's packages)",
            "install it, run from the folder that holds it (or set --workdir), or check the spelling",
        )

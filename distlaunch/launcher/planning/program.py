"""What every rank runs: the command line built from PROGRAM (a script, ``-m MODULE``, an executable), and
the checks that can catch a wrong program before any rank starts, where the ranks start.

Relative paths are the ranks' own: they start in the working directory (``--workdir``, else the
launcher's), so a script is looked for there, not where the launcher was started. The program itself
(``--python``, an interpreter named in PROGRAM, a ``--no-python`` executable) is found as the agent's exec
finds it (``subprocess.Popen`` with ``cwd=workdir``): a name with a slash from the working directory, a bare
name on the ranks' PATH. Those rules are distlaunch/startcheck.py's, shared with the agent, which checks a
remote host with them before any rank starts; this module puts what they find in words, for either.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from distlaunch.contract.env import parse_env
from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError
from distlaunch.startcheck import executable_problem, module_found, program_index, script_problem
from distlaunch.training.argv import ENGINE_PRELOAD, is_engine

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
        return interpreter_script(opts.program)
    return opts.program[0]


def interpreter_script(argv: list[str]) -> str | None:
    """The script in ``python [OPTIONS] SCRIPT ...``, past the interpreter's options (-u, -O, -X dev,
    -W error, ...), where the agent puts rankboot; None for a module, code or stdin."""
    at, kind = program_index(argv)
    return argv[at] if kind == "script" else None


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_preload(text: str) -> str:
    """``--preload``: auto, none, or module names separated by commas; anything else is a UsageError."""
    text = text.strip()
    if text in ("auto", "none"):
        return text
    names = [name.strip() for name in text.split(",")]
    bad = [name for name in names if not _MODULE_NAME.fullmatch(name)]
    if bad:
        raise UsageError(
            f"--preload {text!r}: {bad[0]!r} is not a module name",
            "write auto, none, or module names separated by commas (--preload torch,numpy)",
        )
    return ",".join(names)


def preload_modules(opts: LaunchOptions) -> list[str]:
    """The modules each host imports once, its ranks then forked from that process (agent/warm.py): under auto,
    the engine's for the bundled engine (train, run -m distlaunch.engine), none for any other program, whose
    imports may depend on what it does first."""
    if opts.preload == "none" or opts.no_python:
        return []
    if opts.preload == "auto":
        return list(ENGINE_PRELOAD) if is_engine(opts.module, opts.program) else []
    return opts.preload.split(",")


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
    problem = script_problem(script, workdir or os.getcwd())
    if problem is not None:
        raise start_error(problem, "script", workdir, where, hint)
    path = in_workdir(script, workdir)
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
    """Where every rank starts on this machine: the working directory, the program the ranks exec (the
    ranks' Python, a named interpreter or a --no-python executable) and the script, each refused in one line
    (exit 2) instead of failing on every rank."""
    check_workdir(workdir)
    command = build_command(opts, workdir)
    script = script_of(opts)
    if script is None or command[0] not in (script, f"./{script}"):  # else check_script knows the file best
        check_executable(command[0], program_label(opts), workdir, rank_search_path(opts))
    check_script(opts, workdir=workdir)
    if opts.module and opts.program and opts.python == sys.executable:
        check_module(opts.program[0], workdir)


def rank_search_path(opts: LaunchOptions) -> list[str]:
    """The PATH a local rank's exec searches: the launcher's (local ranks inherit it), or --env PATH=..."""
    return os.get_exec_path({**os.environ, **parse_env(opts.env)})


def program_label(opts: LaunchOptions) -> str:
    """What the user called the thing the ranks exec."""
    if opts.no_python:
        return "program"
    if is_interpreter(opts.program[0]):
        return "interpreter"
    # --remote-python runs the ranks too when --python is not given, this machine's ranks included
    return "--remote-python" if opts.remote_python and opts.python == opts.remote_python else "--python"


def check_executable(program: str, label: str, workdir: str, search_path: list[str]) -> None:
    """``program`` must be a file the ranks can exec: missing is exit 127 on every rank, not executable 126."""
    problem = executable_problem(program, workdir, search_path)
    if problem is not None:
        raise start_error(problem, label, workdir)


def start_error(problem: dict, label: str, workdir: str | None, where: str = "", hint: str | None = None) -> UsageError:
    """A start problem (startcheck) in one line: on this machine (``where`` empty), or on the hosts ``where``
    names (" on node2, node3"). ``label``: what the user called the program; ``hint`` replaces the usual one."""
    kind, name = problem["kind"], problem["name"]
    if kind == "cpu-bind":  # the agent's placement.py said it whole
        return UsageError(problem["error"] + where, problem["hint"])
    relative = not Path(name).is_absolute()
    seen_from = (
        f" (ranks start in {workdir})" if workdir and relative and ("/" in name or kind.startswith("script")) else ""
    )
    if kind == "script-missing":
        return UsageError(
            f"script {name!r} does not exist{where}{seen_from}", hint or "check the path, or use -m MODULE"
        )
    if kind == "script-directory":
        return UsageError(
            f"script {name!r} is a directory without a __main__.py{where}",
            hint or "give the script file inside it, or run a package with -m PACKAGE",
        )
    if kind == "module-missing":
        top = name.split(".")[0]
        python = "this Python's" if not where else "the ranks' Python's"
        return UsageError(
            f"no module named {top!r} for -m {name}{where} (looked in {workdir} and {python} packages)",
            hint or "install it, run from the folder that holds it (or set --workdir), or check the spelling",
        )
    named = f"{label} {name!r}"
    if kind == "program-missing":
        if "/" in name:
            text = f"{named} does not exist {where.strip() or 'on this machine'}{seen_from}"
        else:
            text = f"{named} is not on the ranks' PATH {where.strip() or 'here'}"
        return UsageError(text, hint or _missing_hint(name, label, workdir, local=not where))
    shown = "" if "/" in name else f" (found on PATH as {problem['found']})"
    if kind == "program-directory":
        return UsageError(f"{named} is a directory, not a program{where}{shown}{seen_from}", "give the program's path")
    return UsageError(
        f"{named} is not executable (no execute permission){where}{shown}{seen_from}",
        hint or _not_executable_hint(name, Path(problem["found"]), label, local=not where),
    )


def _missing_hint(program: str, label: str, workdir: str | None, local: bool) -> str:
    if label == "--python":
        start = " (a relative path starts from the working directory)" if "/" in program else ""
        return f"give the path of the Python that runs the ranks{start}, or leave --python out (the launcher's own)"
    if label == "--remote-python":
        return "every rank runs it unless --python is given, this machine's too: give --python a Python every host has"
    if not local and "/" not in program:
        return "ranks on other hosts search their own login PATH, not this machine's: give the program's full path, or --env PATH=..."
    if local and "/" not in program and Path(workdir or ".", program).is_file():
        return f"exec looks a bare name up on PATH: write ./{program} for the file in the working directory"
    if label == "interpreter":
        return "install it, give its path, or leave it out: SCRIPT alone runs with --python (default: the launcher's)"
    return "check the spelling, install it, or give its path (a relative path starts from the working directory)"


def _not_executable_hint(program: str, path: Path, label: str, local: bool) -> str:
    chmod = f"chmod +x {os.path.abspath(path)}"
    if label != "program":
        return f"{chmod}, or give the path of an executable Python"
    interpreter = shebang_interpreter(path) if local else None  # a remote host's file is not read from here
    python_script = is_interpreter(interpreter) if interpreter else path.suffix == ".py"
    if python_script:
        return f"{chmod}, or run it with Python: leave out --no-python (distlaunch run {program})"
    return f"{chmod}, or run it through its interpreter: --no-python {interpreter or 'sh'} {program}"


def shebang_interpreter(path: Path) -> str | None:
    """The command a ``#!`` line names (``/usr/bin/env bash`` names bash), or None without one."""
    try:
        with open(path, "rb") as f:
            head = f.readline(512)
    except OSError:
        return None
    words = head[2:].decode("utf-8", "replace").split() if head.startswith(b"#!") else []
    if len(words) > 1 and Path(words[0]).name == "env" and not words[1].startswith("-"):
        return words[1]
    return Path(words[0]).name if words else None


def check_module(module: str, workdir: str) -> None:
    """``-m MODULE`` with the launcher's own Python: its top-level package must be importable from the
    ranks' working directory (found, not imported: importing could run anything, torch included)."""
    if not module_found(module, workdir):
        raise start_error({"kind": "module-missing", "name": module}, "module", workdir)

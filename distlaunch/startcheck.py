"""What a rank needs before it can start, found by the rules exec and Python use: the program exec runs, the
script or the module Python runs. Each check answers with a problem (a small JSON-able dict) or None.

Standard library only, from the agent's Python floor on (``protocol.PYTHON_FLOOR``): the agent checks its
host with it before any rank starts anywhere, the launcher checks this machine with it, and a rank's own
interpreter runs this file to look for a ``-m`` module. The words for a problem are the launcher's
(launcher/planning/program.py); the rules are here, once.

Problems: ``program-missing``, ``program-directory``, ``program-not-executable``, ``script-missing``,
``script-directory``, ``module-missing``; each with ``name`` (as the user wrote it) and, where one was
found, ``found`` (the path exec or Python would have taken).
"""

from __future__ import annotations

import os
import subprocess
import sys

MODULE_CHECK_TIMEOUT_S = 10.0  # an interpreter that does not answer by then is not judged (the rank will say)
# Interpreter options that take the next word as their value (python -W error -X dev train.py).
_VALUED_LONG_OPTIONS = ("--check-hash-based-pycs",)


def program_index(argv: list[str]) -> tuple[int, str]:
    """Where the program starts in ``python [OPTIONS] SCRIPT|-m MODULE|-c CODE|- [ARGS]``, past the
    interpreter's own options, and what it is: "script", "module" (``-m MODULE``), "code" (``-c CODE``, or a
    group of options that ends in c or m, as ``-uc CODE`` or ``-mjson.tool``: rankboot cannot take those, so
    they run as given), "stdin" (``-``), or "" when nothing follows the options. Python's own grammar: short
    options group (``-uO``); W and X take the rest of their word, or the next word."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-":
            return i, "stdin"
        if not arg.startswith("-"):
            return i, "script"
        if arg == "-m":
            return i, "module"
        if arg.startswith("--"):
            i += 2 if arg in _VALUED_LONG_OPTIONS else 1
            continue
        for j, letter in enumerate(arg[1:], start=1):
            if letter in "cm":  # the rest of the word, or the next word, is the code or the module
                return i, "code"
            if letter in "WX":
                i += 1 if j < len(arg) - 1 else 2
                break
        else:
            i += 1
    return i, ""


def is_python(argv: list[str]) -> bool:
    """A rank run by a Python interpreter on a script or module (what rankboot can start)."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return False
    return program_index(argv)[1] in ("script", "module")


def in_workdir(path: str, workdir: str) -> str:
    """``path`` as a rank sees it from its working directory (an absolute path stays as it is)."""
    return os.path.join(workdir, path)


def exec_candidates(program: str, workdir: str, search_path: list[str]) -> list[str]:
    """The files exec tries, in order, for ``program`` run with ``workdir`` as the current directory: a
    name with a slash is that path from ``workdir``; a bare name is tried in each PATH entry (a relative
    entry, too, is relative to ``workdir``). The first one that can run is run."""
    if "/" in program:
        return [in_workdir(program, workdir)]
    return [in_workdir(os.path.join(folder, program), workdir) for folder in search_path]


def executable_problem(program: str, workdir: str, search_path: list[str]) -> dict | None:
    """``program`` must be a file the ranks can exec (missing: exit 127 on every rank; not runnable: 126)."""
    candidates = exec_candidates(program, workdir, search_path)
    if any(os.path.isfile(path) and os.access(path, os.X_OK) for path in candidates):
        return None
    present = next((path for path in candidates if os.path.exists(path)), None)
    if present is None:
        return {"kind": "program-missing", "name": program}
    kind = "program-directory" if os.path.isdir(present) else "program-not-executable"
    return {"kind": kind, "name": program, "found": present}


def script_problem(script: str, workdir: str) -> dict | None:
    """The script Python is to run: a file, or a folder with a __main__.py."""
    path = in_workdir(script, workdir)
    if not os.path.exists(path):
        return {"kind": "script-missing", "name": script}
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "__main__.py")):
        return {"kind": "script-directory", "name": script, "found": path}
    return None


def module_found(module: str, workdir: str) -> bool:
    """Whether ``python -m MODULE`` started in ``workdir`` finds the module's top-level package (found, not
    imported: importing could run anything, torch included). As python -m: the working directory first."""
    import importlib.util

    top = module.split(".")[0]
    sys.path.insert(0, workdir)
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path.remove(workdir)


def module_problem(
    python: str, module: str, workdir: str, env: dict, timeout: float = MODULE_CHECK_TIMEOUT_S
) -> dict | None:
    """``module_found``, asked of the rank's own interpreter (this file, run by it). An interpreter that
    cannot run it, or does not answer in time, is not judged here: the rank's own start will say why."""
    try:
        done = subprocess.run(
            [python, os.path.abspath(__file__), "--find-module", module],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode == 3:
        return {"kind": "module-missing", "name": module, "found": workdir}
    return None


def start_problems(argv: list[str], workdir: str, env: dict, timeout: float = MODULE_CHECK_TIMEOUT_S) -> list[dict]:
    """Everything that keeps ``argv`` from starting on this host, run from ``workdir`` with ``env`` (the
    rank's own environment: its PATH finds the program); ``timeout``: for the interpreter asked about a module."""
    problem = executable_problem(argv[0], workdir, os.get_exec_path(env))
    if problem is not None:
        return [problem]
    if not is_python(argv):
        return []
    at, kind = program_index(argv)
    if kind == "script":
        problem = script_problem(argv[at], workdir)
    elif kind == "module" and at + 1 < len(argv):
        problem = module_problem(argv[0], argv[at + 1], workdir, env, timeout)
    return [problem] if problem else []


if __name__ == "__main__":  # python startcheck.py --find-module MODULE: exit 3 when it is not found
    if len(sys.argv) == 3 and sys.argv[1] == "--find-module":
        sys.path.pop(0)  # this file's folder, which a rank's python -m would not see
        sys.exit(0 if module_found(sys.argv[2], os.getcwd()) else 3)
    sys.exit(2)

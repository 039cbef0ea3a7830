"""The programs distlaunch starts are its entry points, and no library module names a CLI module.

The import contracts (pyproject.toml) see imports; a module started as a program (``python -m X``) is named in a
string, which they cannot see. These tests hold the strings to the same rule: below the CLI, nothing names a
module of ``distlaunch.cli`` (a detached job's supervisor is ``distlaunch.supervisor``, an entry point beside the
CLI), and every module the library runs with ``-m`` is a program."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
from pathlib import Path

from distlaunch.launcher.running.detach import SUPERVISOR
from distlaunch.training.argv import ENGINE_MODULE

PACKAGE = Path(__file__).resolve().parents[2] / "distlaunch"
ABOVE_THE_LIBRARY = ("cli", "__main__.py", "supervisor.py")  # the CLI and the entry points may name the CLI
MODULE = re.compile(r"distlaunch(\.\w+)+")


def _strings(path: Path) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _library_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ABOVE_THE_LIBRARY]


def test_no_library_module_names_a_cli_module():
    named = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in _library_files()
        for line, text in _strings(path)
        if re.fullmatch(r"distlaunch\.cli(\.\w+)*", text)
    ]
    assert named == []


def _started_with_dash_m(path: Path) -> list[str]:
    """The modules a list display runs as ``[..., "-m", "distlaunch.x", ...]``."""
    started = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.List):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            started += [
                b for a, b in itertools.pairwise(items) if a == "-m" and isinstance(b, str) and MODULE.fullmatch(b)
            ]
    return started


def test_every_module_the_library_starts_is_a_program():
    started = {module for path in _library_files() for module in _started_with_dash_m(path)}
    started |= {SUPERVISOR, ENGINE_MODULE}
    assert "distlaunch.agent" in started  # the list above is read, not assumed
    for module in sorted(started):
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        main = importlib.util.find_spec(f"{module}.__main__") if spec.submodule_search_locations else None
        source = Path(spec.origin).read_text(encoding="utf-8")
        assert main is not None or 'if __name__ == "__main__":' in source, f"{module} is not a program"

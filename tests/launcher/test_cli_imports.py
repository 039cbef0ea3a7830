"""Each command imports what it uses and nothing of the others: read from a fresh interpreter's ``sys.modules``
after the command ran, so a module that starts importing another command's libraries fails here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import typer

from distlaunch.cli.commands import COMMANDS, load

COMMAND_MODULES = {entry.module for entry in COMMANDS.values()}  # distlaunch.cli.run, distlaunch.cli.slurm, ...
HEAVY = ("torch", "paramiko", "yaml", "matplotlib", "tokenizers", "tiktoken", "wandb", "tensorboard")

# what each path must not import: heavy libraries it has no use for, and the other commands' modules
CASES = {
    "--help": (["--help"], [*HEAVY, "pydantic", "rich", "distlaunch.launcher", "distlaunch.backends", *COMMAND_MODULES]),
    "run": (
        ["run", "--dry-run", "-n", "2", "noop.py"],
        [*HEAVY, "distlaunch.doctor", "distlaunch.k8s", "distlaunch.data", *(COMMAND_MODULES - {"distlaunch.cli.run"})],
    ),
    "train": (
        ["train", "--dry-run"],
        [*HEAVY, "distlaunch.doctor", "distlaunch.k8s", "distlaunch.cli.slurm", "distlaunch.cli.doctor",
         "distlaunch.cli.k8s", "distlaunch.cli.data", "distlaunch.cli.checkpoint"],
    ),
    "jobs": (
        ["jobs"],
        [*HEAVY, "distlaunch.doctor", "distlaunch.data", "distlaunch.training.planner",
         *(COMMAND_MODULES - {"distlaunch.cli.jobs"})],
    ),
    "doctor --help": (
        ["doctor", "--help"],
        [*HEAVY, "distlaunch.k8s", "distlaunch.data", *(COMMAND_MODULES - {"distlaunch.cli.doctor"})],
    ),
}  # fmt: skip

PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from distlaunch.cli.app import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(sys.argv[1:])
    print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
    """
)


def imported(args: list[str], cwd) -> list[str]:
    (cwd / "noop.py").write_text("pass\n")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=True
    )
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["code"] == 0, (args, out.stderr)
    return found["modules"]


@pytest.mark.parametrize("case", list(CASES))
def test_a_command_imports_nothing_it_does_not_use(case, tmp_path):
    args, forbidden = CASES[case]
    modules = imported(args, tmp_path)
    extra = sorted(m for m in modules for f in forbidden if m == f or m.startswith(f + "."))
    assert not extra, f"distlaunch {' '.join(args)} imports {extra}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_command_list_says_what_each_command_says_of_itself(name):
    command = load(name)
    own = command.help if isinstance(command.help, str) else ""
    first = " ".join(own.split("\n\n")[0].split())
    assert COMMANDS[name].help == first, f"distlaunch/cli/commands.py: the help of {name} is {first!r}"


def test_the_command_list_needs_no_command_module():
    """``distlaunch --help`` lists every command (the help above) without importing one."""
    from typer.testing import CliRunner

    from distlaunch.cli.app import app

    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0
    for name, entry in COMMANDS.items():
        assert f"{name} " in listed.output and entry.help.split(" (")[0][:40] in listed.output
    assert isinstance(typer.main.get_command(app), typer.core.TyperGroup)

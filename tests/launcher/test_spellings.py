"""One spelling per concept: every command that reaches hosts takes the host options, declared once; Slurm's and
Kubernetes' commands show their own words and take distlaunch's as hidden aliases; a word that would mean
something else is refused in one line; docs/cli.md's table of shared options is the commands'. Through the CLI,
with dry runs and refusals: nothing starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer

from distlaunch.cli import groups as g
from distlaunch.cli.commands import load
from tests.helpers import invoke

HOST_COMMANDS = ("run", "train", "doctor", "hosts")
CLI_MD = Path(__file__).parents[2] / "docs" / "cli.md"


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("pass\n", encoding="utf-8")
    return str(path)


def declared() -> dict[str, tuple[set[str], str | None]]:
    """The host options as their one declaration makes them: each one's flags and metavar, by name."""
    app = typer.Typer(add_completion=False)

    @app.command()
    @g.with_options(g.HOST_OPTIONS, build=lambda values, ctx: values, into="hosts")
    def command(hosts: dict) -> None:
        """Only the host options."""

    return {param.name: (set(param.opts), param.metavar) for param in typer.main.get_command(app).params}


def params(*command: str) -> dict:
    """The parameters of ``distlaunch COMMAND [SUBCOMMAND]``, by name."""
    found = load(command[0])
    for sub in command[1:]:
        found = found.commands[sub]
    return {param.name: param for param in found.params}


@pytest.mark.parametrize("command", HOST_COMMANDS)
def test_every_command_that_reaches_hosts_takes_the_host_options_as_declared_once(command):
    taken = params(command)
    for name, (flags, metavar) in declared().items():
        assert name in taken, f"{command} lacks {sorted(flags)}"
        param = taken[name]
        assert (set(param.opts), param.metavar, param.hidden) == (flags, metavar, False), (command, param.opts)


@pytest.mark.parametrize("command", ["run", "train"])
def test_run_and_train_take_the_host_options_on_a_dry_run(command, tmp_path, script):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n", encoding="utf-8")
    config = tmp_path / "ssh_config"
    config.write_text("", encoding="utf-8")
    host_options = ["-H", str(hostfile), "-i", "localhost:0", "--ssh-config", str(config)]
    host_options += ["--accept-new-host-keys", "--remote-python", "python3"]
    program = [script] if command == "run" else []
    r = invoke([command, *host_options, "--dry-run", "--json", *program])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)


@pytest.mark.parametrize("command", ["doctor", "hosts"])
def test_doctor_and_hosts_take_the_host_options_and_read_the_hostfile_before_any_host(command, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 gpus=8\n", encoding="utf-8")  # wrong: refused before any host is reached
    host_options = ["-H", str(hostfile), "-i", "node1", "--ssh-config", str(tmp_path / "cfg")]
    host_options += ["--accept-new-host-keys", "--remote-python", "python3"]
    if command == "doctor":  # and what run would use on the hosts
        host_options += ["--python", "python3", "--workdir", str(tmp_path), "-n", "2"]
    r = invoke([command, *host_options])
    assert r.exit_code == 2 and "No such option" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: hostfile ") or "line 1" in r.stderr, r.stderr


def test_slurm_takes_runs_words_for_nodes_and_ranks_per_node(script):
    slurm_words = invoke(["slurm", "run", "-N", "2", "--ntasks-per-node", "3", "--dry-run", script])
    assert slurm_words.exit_code == 0, slurm_words.stderr
    assert "--nodes=2 --ntasks=6 --ntasks-per-node=3" in slurm_words.stdout
    for words in (["--nnodes", "2", "-n", "3"], ["--nnodes", "2", "--nproc-per-node", "3"]):
        r = invoke(["slurm", "run", *words, "--dry-run", script])
        assert (r.exit_code, r.stdout) == (0, slurm_words.stdout), r.stderr
    batch = invoke(["slurm", "sbatch", "--nnodes", "3", "--dry-run", script])
    assert batch.exit_code == 0 and "#SBATCH --nodes=3" in batch.stdout, batch.stderr


def test_k8s_takes_runs_word_for_nodes():
    r = invoke(["k8s", "manifest", "--image", "img:1", "--nnodes", "3", "--json", "--", "train.py"])
    assert r.exit_code == 0, r.stderr
    _, job = json.loads(r.stdout)
    assert job["spec"]["completions"] == 3
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--nnodes") + 1] == "3"


@pytest.mark.parametrize(
    "args",
    [
        ["slurm", "run", "-N", "2", "--nnodes", "3", "--dry-run"],
        ["k8s", "manifest", "--image", "img:1", "--nodes", "2", "--nnodes", "3", "--"],
    ],
)
def test_an_alias_and_its_option_with_two_values_are_one_line(args, script):
    r = invoke([*args, script])
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip() == "error: --nnodes 3 and --nodes 2 are one option given twice (hint: give --nodes once)"


@pytest.mark.parametrize(
    ("command", "shown", "hidden"),
    [
        (["slurm", "run"], ["-N", "--ntasks-per-node", "--ntasks"], ["--nnodes", "-n", "--nproc-per-node"]),
        (["slurm", "sbatch"], ["-N", "--ntasks-per-node"], ["--nnodes", "-n", "--nproc-per-node"]),
        (["k8s", "manifest"], ["-N", "-n", "--backoff-limit"], ["--nnodes", "--max-restarts"]),
        (["logs"], ["--tail", "-r"], ["-n"]),
    ],
)
def test_help_shows_each_commands_own_word_and_hides_the_others(command, shown, hidden):
    visible = {flag for param in params(*command).values() if not param.hidden for flag in param.opts}
    taken = {flag for param in params(*command).values() for flag in param.opts}
    assert set(shown) <= visible and set(hidden) <= taken - visible, (command, visible)
    assert invoke([*command, "--help"]).exit_code == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["logs", "dl-1", "-n", "5"], "error: -n is the ranks per host in distlaunch's other commands"),
        (["k8s", "manifest", "--image", "i", "--max-restarts", "2", "--", "t.py"], "give --backoff-limit N"),
        (["run", "-N", "2", "t.py"], "-N is sbatch/srun's option, not distlaunch run's (hint: in distlaunch, use -H"),
        (["run", "--ntasks-per-node", "2", "t.py"], "(hint: in distlaunch, use -n N (ranks per host))"),
    ],
)
def test_a_word_that_means_something_else_here_is_refused_in_one_line(args, said):
    r = invoke(args)
    assert r.exit_code == 2 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_shared_options_table_in_the_docs_is_the_commands():
    section = CLI_MD.read_text(encoding="utf-8").split("## Shared options", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `-") and "✓" in line]
    documented = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        flags = frozenset(re.findall(r"--?[\w-]+", cells[0]))
        documented[flags] = [cmd for cmd, cell in zip(HOST_COMMANDS, cells[1:5], strict=True) if cell]
    assert documented == {frozenset(flags): list(HOST_COMMANDS) for flags, _ in declared().values()}

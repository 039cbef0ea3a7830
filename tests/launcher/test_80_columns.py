"""Every table and report distlaunch prints stays readable at 80 columns: no line passes 80, and no word of what
the user gave (a path, a script, a host name) is cut across two lines, as a table cell too narrow for it would
(``pyth│on3``, ``train-ti│ny-cpu.toml``). Rendered by rich at 80 columns, as a terminal of that width shows them."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable

import pytest
from rich.console import Console

from distlaunch.cli.doctor_render import render_report as render_doctor
from distlaunch.cli.render import render_recovery, render_report
from distlaunch.contract.report import (
    AttemptReport,
    FaultCost,
    Goodput,
    HangReport,
    RankExit,
    RunReport,
    Straggler,
)
from distlaunch.doctor.model import Check, DoctorReport
from distlaunch.launcher.planning.train import EMBEDDED_CONFIG
from tests.helpers import invoke

WIDTH = 80
HOSTS = ["gpu-node-017.cluster.example.org", "gpu-node-018.cluster.example.org", "gpu-node-019.cluster.example.org"]
SCRIPT = "experiments/train_language_model.py"
DATA = "/datasets/openwebtext/tokenized-gpt2-shards"
TRACEBACK_PATH = "/home/me/projects/llm/experiments/train_language_model.py"
STACKS = "/home/me/.local/state/distlaunch/jobs/dl-0123456789ab/stacks-1"


def assert_readable(text: str, words: list[str]) -> None:
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, "lines over 80 columns:\n" + "\n".join(wide)
    cut = [word for word in words if not any(word in line for line in lines)]
    assert not cut, f"cut across lines: {cut}\n{text}"


def rendered(draw: Callable[[Console], None]) -> str:
    out = io.StringIO()
    draw(Console(file=out, width=WIDTH, color_system=None))
    return out.getvalue()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with its training script, the current folder as a user runs distlaunch from it."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / SCRIPT).write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _fits_a_line(*words: str) -> list[str]:
    """The words that fit a line at all: one longer than a line is the terminal's to wrap, not ours to keep."""
    return [word for word in words if len(word) <= WIDTH - 12]


def test_the_local_dry_run_plan(project):
    r = invoke(["run", "--dry-run", "-n", "4", SCRIPT, "--data-dir", DATA], env={"COLUMNS": str(WIDTH)})
    assert r.exit_code == 0, r.stderr
    words = [SCRIPT, DATA, "--data-dir", "backend gloo", *_fits_a_line(sys.executable, str(project))]
    assert_readable(r.stdout, words)  # the header breaks between its clauses, never inside one


def test_the_training_dry_run_plan_and_its_memory_table(project):
    r = invoke(["train", "--dry-run"], env={"COLUMNS": str(WIDTH)})
    assert r.exit_code == 0, r.stderr
    words = ["train-tiny-cpu.toml", "distlaunch.engine", *_fits_a_line(str(EMBEDDED_CONFIG), sys.executable)]
    assert_readable(r.stdout, [*words, "backend gloo", "activations", "optimizer", "step peak at: "])


def test_the_layouts_of_a_dry_run_with_parallel_auto(project):
    hostfile = project / "cluster-hosts.txt"
    hostfile.write_text("".join(f"{host} slots=8\n" for host in HOSTS[:2]))
    config = str(EMBEDDED_CONFIG.with_name("train-1.3b-3d.toml"))
    args = ["train", config, "-H", str(hostfile), "--backend", "nccl", "--gpu-memory", "80GiB", "--dry-run"]
    r = invoke([*args, "--parallel", "auto", "--link", "inter=10Gbit"], env={"COLUMNS": str(WIDTH)})
    assert r.exit_code == 0, r.stderr
    assert_readable(r.stdout, ["--parallel auto: the 5 fastest layouts", "of the step: ", "predicted step: "])


def test_the_multi_host_dry_run_plan(project):
    hostfile = project / "cluster-hosts.txt"
    hostfile.write_text("".join(f"{host} slots=8\n" for host in HOSTS[:2]))
    r = invoke(
        ["run", "-H", str(hostfile), "--backend", "nccl", "--dry-run", SCRIPT, "--data-dir", DATA],
        env={"COLUMNS": str(WIDTH)},
    )
    assert r.exit_code == 0, r.stderr
    assert_readable(r.stdout, [*HOSTS[:2], SCRIPT, DATA, "CUDA_VISIBLE_DEVICES 0,1,2,3,4,5,6,7", "cuda:0-7"])


def test_the_report_of_a_failed_run():
    tail = [
        "Traceback (most recent call last):",
        f'  File "{TRACEBACK_PATH}", line 42, in <module>',
        "    torch.distributed.all_reduce(gradients)",
        "RuntimeError: [/opt/pytorch/third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    ]
    report = RunReport(
        job_id="dl-0123456789ab",
        exit_code=1,
        world_size=16,
        failures=[
            RankExit(rank=3, host=HOSTS[0], exit_code=1, tail=tail, time_s=12.3),
            RankExit(rank=12, host=HOSTS[1], exit_code=137, signal="SIGKILL", tail=["killed"], time_s=12.4),
        ],
        stragglers_found=[Straggler(rank=5, host=HOSTS[1], factor=2.1, steps=50)],
        wall_s=30.0,
    )
    text = rendered(lambda console: render_report(report, console))
    assert_readable(text, [*HOSTS[:2], TRACEBACK_PATH, "[/opt/pytorch/third_party/gloo/transport/tcp/pair.cc:534]"])
    assert "137 (SIGKILL)" in text and "rank 3, its last output:" in text


def test_a_hang_report():
    summary = f"ranks 0-2 wait in all_reduce ({TRACEBACK_PATH}:42); rank 3 in load_batch (data.py:40) on {HOSTS[1]}"
    report = RunReport(
        job_id="dl-0123456789ab",
        exit_code=124,
        world_size=4,
        hang=HangReport(timeout_s=600, summary=summary, folder=STACKS),
    )
    text = rendered(lambda console: render_report(report, console))
    assert_readable(text, [HOSTS[1], f"({TRACEBACK_PATH}:42);", STACKS])


def test_a_recovery_report():
    attempts = [
        AttemptReport(
            restart=0, hosts=HOSTS[:2], world_size=16, layout="dp=4,tp=2,pp=2,zero=1", first_step=1, last_step=40,
            ended=f"rank 3 on {HOSTS[0]} exited with code 1",
        ),
        AttemptReport(
            restart=1, hosts=HOSTS[1:], world_size=16, layout="dp=4,tp=2,pp=2,zero=1", first_step=31, last_step=100,
            dropped={HOSTS[0]: "rank 3 exited with code 1"}, added=[HOSTS[2]], ended="finished",
        ),
    ]  # fmt: skip
    fault = FaultCost(
        fault=f"rank 3 on {HOSTS[0]} exited with code 1", detection_s=0.1, stopping_s=1.0, restart_s=2.0,
        startup_s=3.0, recomputed_steps=1, recomputed_s=0.8,
    )  # fmt: skip
    goodput = Goodput(wall_s=300, productive_s=250, ettr=250 / 300, faults=[fault])
    text = rendered(lambda console: render_recovery(attempts, goodput, console))
    assert_readable(text, [*HOSTS, "dp=4,tp=2,pp=2,zero=1", f"-{HOSTS[0]}", f"+{HOSTS[2]},"])


def test_the_doctor_report_of_hosts_with_long_names():
    python = "/opt/conda/envs/training-2024/bin/python3.11"
    checks = [Check(id="hostfile", host="(local)", status="pass", detail="cluster-hosts.txt: 2 hosts, 16 slots")]
    for host in HOSTS[:2]:
        checks += [
            Check(id="python", host=host, status="pass", detail=f"{python} (Python 3.11.7, distlaunch 0.1.0)"),
            Check(
                id="loopback-hostname", host=host, status="fail", detail=f"{host} resolves to 127.0.1.1 on {host}",
                hint=f"map {host} to its real address in /etc/hosts (docs/troubleshooting.md#loopback-hostname)",
            ),
            Check(id="nccl", host=host, status="skip", detail="no GPUs: ranks use gloo on CPU, NCCL is not needed"),
        ]  # fmt: skip
    text = rendered(lambda console: render_doctor(DoctorReport(ok=False, checks=checks), console))
    assert_readable(text, [*HOSTS[:2], python, "loopback-hostname", "/etc/hosts", "NOT READY"])


def test_a_real_80_column_terminal_shows_the_multi_host_dry_run_whole(project, tmp_path):
    """The same in a real terminal of 80 columns (tmux), where rich measures the width itself; -J joins what the
    terminal wrapped, so a line rich let pass 80 columns shows as one."""
    from fixtures.terminal import Terminal

    (project / "hosts.txt").write_text("".join(f"{host} slots=8\n" for host in HOSTS[:2]))
    term = Terminal(tmp_path, width=WIDTH, height=50)
    try:
        term.run(f"distlaunch run -H hosts.txt --backend nccl --dry-run {SCRIPT} --data-dir {DATA}", cwd=project)
        assert term.exit_code(60) == 0, term.history()
        assert_readable(term.history(), [*HOSTS[:2], SCRIPT, DATA])
    finally:
        term.close()

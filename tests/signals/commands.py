"""The commands the signal tests stop, each as a user runs it, in a try's own folder (tests/signals/stress.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.helpers import running, wait_until
from tests.signals.stress import Command, python_marking, records


def distlaunch_cmd(*args: str) -> list[str]:
    """The console script, as a user types ``distlaunch``: its interpreter's first moments, before distlaunch has a
    handler, end a SIGINT as Python ends any program (it dies by the signal)."""
    return [str(Path(sys.executable).with_name("distlaunch")), *args]


RANK = "import os, time\nprint('rank', os.environ['RANK'], 'up', flush=True)\ntime.sleep(0.5)\n"
LONG_RANK = "import os, time\nprint('rank', os.environ['RANK'], 'up', flush=True)\ntime.sleep(1.5)\n"
TEXT = "".join(f"Line {i} of the corpus, with words that repeat: the quick brown fox {i % 97}.\n" for i in range(6000))


def _script(folder: Path, text: str) -> str:
    path = folder / "rank.py"
    path.write_text(text)
    return str(path)


def _half_written(folder: Path) -> list[str]:
    """A prepare's output: absent, or whole (its index written last); never a folder it was building."""
    hidden = sorted(p.name for p in folder.glob(".out.*"))
    problems = [f"half-written folders left: {hidden}"] if hidden else []
    out = folder / "out"
    if out.exists() and not (out / "index.json").exists():
        problems.append("out exists without its index")
    return problems


def _supervisor(folder: Path) -> dict | None:
    found = records(folder)
    return found[0] if found else None


def _supervisor_pid(proc, folder: Path) -> int | None:
    """The detached job's supervisor, once ``run --detach`` has handed the job to it."""
    proc.wait()
    record = _supervisor(folder)
    return record["owner"]["pid"] if record and record.get("owner") else None


def _supervisor_end(proc, folder: Path) -> int | None:
    """How the detached job ended, as its record says once its supervisor is gone."""
    pid = _supervisor_pid(proc, folder)
    if pid is not None:
        wait_until(lambda: not running(pid), timeout=60)
    time.sleep(0.05)
    record = _supervisor(folder)
    return None if record is None else record.get("exit_code")


def _job_going(folder: Path, sent_at: float) -> bool:
    """A signal the supervisor got once its job had ended (its record final) came after the work: the record
    keeps how the job ended, and that try counts as one without a signal."""
    record = _supervisor(folder)
    return record is None or record.get("ended_at") is None or record["ended_at"] > sent_at


def _supervisor_said(folder: Path, stderr: str) -> str:
    logs = list((folder / "state").rglob("output.log"))
    return stderr + "".join(log.read_text(errors="replace") for log in logs)


def supervisor_command() -> Command:
    return Command(
        "run --detach (its supervisor)",
        lambda f: distlaunch_cmd("run", "--detach", "-n", "2", _script(f, RANK)),
        signal_to=_supervisor_pid,
        ended=_supervisor_end,
        said=_supervisor_said,
        reached=_job_going,
    )


def run_command(rank: str = RANK) -> Command:
    return Command("run -n 2", lambda f: distlaunch_cmd("run", "-n", "2", _script(f, rank)))


def train_command() -> Command:
    sets = ["train.steps=3", "train.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=2"]
    flags = [word for s in sets for word in ("--set", s)]
    return Command("train -n 2", lambda f: distlaunch_cmd("train", "-n", "2", "--log-dir", str(f / "logs"), *flags))


def prepare_command(root: Path) -> Command:
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT)
    return Command(
        "data prepare",
        lambda f: distlaunch_cmd("data", "prepare", str(corpus), "--out", str(f / "out"), "--tokenizer", "bpe:400"),
        leftovers=_half_written,
    )


def doctor_command(sshd_cluster, root: Path) -> Command:
    hostfile = sshd_cluster.write_hostfile(root / "hosts", 2, slots=1)

    def argv(folder: Path) -> list[str]:
        remote = ["--ssh-config", str(sshd_cluster.ssh_config), "--remote-python", str(python_marking(folder))]
        return distlaunch_cmd("doctor", "-H", str(hostfile), *remote)

    return Command("doctor", argv, ok_codes=(0, 1))  # a check that fails on this machine is the doctor's answer

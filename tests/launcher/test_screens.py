"""What a person sees at 80 columns, recorded from a real terminal (tmux) and kept as golden files: the bundled
training job, a failing run, a hang and a dry-run. A change in any of them fails here until the golden file is
written again (UPDATE_GOLDEN=1) and the new screen is reviewed in the diff.

The figures that change from run to run (times, rates, losses, ports, job ids, process ids, the test's temporary
folder) are replaced by placeholders first; the words, the order of the lines and the layout stay. Whatever the
figures, no line may pass 80 columns."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.terminal import Terminal

GOLDEN = Path(__file__).parent / "golden" / "screens"
WIDTH = 80

# numbers that name something stay (rank 3, step 20/20, dp=2, exit 124); the others are measurements
_NUMBER = re.compile(r"(?<![\w.-])(?<!rank )(?<!ranks )(?<!step )(?<!=)(?<!exit )(?<!/)\d+(?:[.:,]\d+)*(?:e[-+]?\d+)?")


def normalized(text: str, folder: Path) -> str:
    """``text`` with what differs between runs and machines replaced; runs of spaces (a table's padding around a
    replaced figure) shortened to two."""
    places = {
        str(folder): "<tmp>",
        os.environ["DISTLAUNCH_STATE_DIR"]: "<state>",
        str(Path(__file__).resolve().parents[2]): "<repo>",
        str(Path(sys.executable).parent): "<bin>",
    }
    for place, name in sorted(places.items(), key=lambda item: -len(item[0])):
        text = text.replace(place, name)
    text = re.sub(r"<bin>/python[\d.]*", "<python>", text)
    text = re.sub(r"\bdl-[0-9a-f]{12}\b", "dl-<id>", text)
    text = re.sub(r"(distlaunch-dl-<id>-)\w+", r"\1<random>", text)
    text = re.sub(r"\b0x[0-9a-f]+\b", "0x<addr>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?[kM]? tok/s", "N tok/s", text)  # 950 or 10.6k: the machine's speed
    text = _NUMBER.sub("N", text)
    return "\n".join(re.sub(r" {2,}", "  ", line).rstrip() for line in text.splitlines())


def check_screen(name: str, history: str, folder: Path) -> None:
    wide = [line for line in history.splitlines() if len(line) > WIDTH]
    assert not wide, f"lines over {WIDTH} columns:\n" + "\n".join(wide)
    seen = normalized(history, folder)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(seen + "\n")
    assert seen == path.read_text().rstrip("\n"), f"the screen changed (UPDATE_GOLDEN=1 writes it):\n{seen}"


@pytest.fixture
def terminal(tmp_path):
    term = Terminal(tmp_path, width=WIDTH, height=50)
    yield term
    term.close()


def script(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(textwrap.dedent(text))


def test_the_bundled_training_job(terminal, tmp_path):
    terminal.run("distlaunch train --set train.steps=20 --set train.eval_every=10", cwd=tmp_path)
    assert terminal.exit_code(240) == 0
    check_screen("train", terminal.history(), tmp_path)


def test_a_failing_run(terminal, tmp_path):
    script(
        tmp_path,
        "fails.py",
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("loading shard 1", flush=True)
            time.sleep(0.5)
            print("Traceback (most recent call last):", file=sys.stderr)
            print("ValueError: shard 1 is empty", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(60)
        """,
    )
    terminal.run("distlaunch run -n 2 fails.py", cwd=tmp_path)
    assert terminal.exit_code(120) == 3
    check_screen("failing_run", terminal.history(), tmp_path)


def test_a_hang(terminal, tmp_path):
    script(
        tmp_path,
        "hangs.py",
        """
        import os, time
        # rank 1 speaks once rank 0 has, so the two lines reach the screen in one order
        while os.environ["RANK"] == "1" and not os.path.exists("rank0-said"):
            time.sleep(0.05)
        print("rank", os.environ["RANK"], "waits for a peer that never comes", flush=True)
        open(f"rank{os.environ['RANK']}-said", "w").close()
        while True:
            time.sleep(1)
        """,
    )
    terminal.run("distlaunch run -n 2 --hang-timeout 3 hangs.py", cwd=tmp_path)
    assert terminal.exit_code(120) == 124
    check_screen("hang", terminal.history(), tmp_path)


def test_a_dry_run(terminal, tmp_path):
    terminal.run("distlaunch train --dry-run", cwd=tmp_path)
    assert terminal.exit_code(60) == 0
    check_screen("dry_run", terminal.history(), tmp_path)

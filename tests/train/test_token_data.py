"""Data a job cannot train on is refused when the ranks load it, before the first step: a token
file with an id outside the model's vocabulary (wherever it lies, sampled or not), and an empty text
file. One line, exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distlaunch.engine.data import load_split
from distlaunch.errors import UsageError
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.preset='tiny'", "train.steps=2", "train.global_batch_size=4", "train.seq_len=32"]


def train(data: Path, *extra: str) -> tuple[int, str]:
    """``distlaunch train -n 1`` on ``data`` (the launcher does not read the data: the rank does)."""
    sets = [arg for o in [*SMALL, f"data.path='{data}'", *extra] for arg in ("--set", o)]
    env = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    r = run_cli("train", "-n", "1", "--grace-period", "1", *sets, env=env, cwd=data.parent, timeout=180)
    return r.returncode, r.stdout + r.stderr


def test_a_bad_id_anywhere_in_a_token_file_stops_the_job_before_the_first_step(tmp_path):
    tokens = np.full(8000, 7, dtype="<u2")
    tokens[-1] = 300  # in the held-out tail: no training batch ever samples it, no evaluation runs
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    code, output = train(path)
    expected = f"[rank 0] error: {path} holds token id 300, outside the model's vocabulary of 256 (hint: "
    assert code == 2 and expected in output, output[-3000:]
    assert "Traceback" not in output and "step 1/" not in output


@pytest.mark.parametrize(("dtype", "bad"), [("uint16", 256), ("uint32", 2**32 - 1)])
def test_token_file_ids_are_checked_in_every_dtype_when_loaded(tmp_path, dtype, bad):
    tokens = np.full(1000, 255, dtype=np.dtype(dtype).newbyteorder("<"))
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    train_part, held_out = load_split(str(path), "auto", dtype, 0.1, vocab_size=256)  # 255: the largest byte id
    assert train_part.numel() + held_out.numel() == 1000
    tokens[10] = bad  # uint32 ids are read as int32: 2**32 - 1 is -1 there, and must still be caught
    tokens.tofile(path)
    with pytest.raises(UsageError, match=f"holds token id {bad}, outside the model's vocabulary of 256"):
        load_split(str(path), "auto", dtype, 0.1, vocab_size=256)


def test_an_empty_text_file_is_one_line_like_an_empty_token_file(tmp_path):
    for name in ("empty.txt", "empty.bin"):
        path = tmp_path / name
        path.write_bytes(b"")
        code, output = train(path)
        expected = "[rank 0] error: the training data has 0 tokens, fewer than seq_len+2=34 (hint: "
        assert code == 2 and expected in output, (name, output[-3000:])
        assert "Traceback" not in output and "ValueError" not in output

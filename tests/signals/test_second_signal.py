"""A second signal while a command cleans up after the first leaves nothing behind either: the command ends with
128 + the first signal it saw (a running job's second Ctrl-C kills its ranks at once, as it always did)."""

from __future__ import annotations

from tests.signals.commands import (
    LONG_RANK,
    doctor_command,
    prepare_command,
    run_command,
    supervisor_command,
    train_command,
)
from tests.signals.stress import stress_twice, verdict

TRIES = 18  # a third per first signal, each with a second one within 0.3 s
TRAIN_TRIES = 12


def test_run(tmp_path):
    outcomes = stress_twice(run_command(LONG_RANK), tmp_path, TRIES, seed=11)
    assert not verdict(outcomes), verdict(outcomes)


def test_train(tmp_path):
    outcomes = stress_twice(train_command(), tmp_path, TRAIN_TRIES, seed=12)
    assert not verdict(outcomes), verdict(outcomes)


def test_data_prepare(tmp_path):
    outcomes = stress_twice(prepare_command(tmp_path), tmp_path, TRIES, seed=13)
    assert not verdict(outcomes), verdict(outcomes)


def test_doctor(sshd_cluster, tmp_path):
    outcomes = stress_twice(doctor_command(sshd_cluster, tmp_path), tmp_path, TRIES, seed=14)
    assert not verdict(outcomes), verdict(outcomes)


def test_detached_supervisor(tmp_path):
    outcomes = stress_twice(supervisor_command(), tmp_path, TRIES, seed=15)
    assert not verdict(outcomes), verdict(outcomes)

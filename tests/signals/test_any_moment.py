"""A signal is never lost: SIGINT, SIGTERM or SIGHUP at any moment of a command's life (start-up and imports
included) ends it with 128 + the signal, one line saying what stopped, and nothing left behind.

Each command gets TRIES tries, a third per signal, their delays in as many slices of its whole life
(tests/signals/stress.py). Training gets fewer: its ranks' part of the life is the job's trap, as in ``run``."""

from __future__ import annotations

import pytest

from tests.signals.commands import doctor_command, prepare_command, run_command, supervisor_command, train_command
from tests.signals.stress import stress, verdict

TRIES = 45
TRAIN_TRIES = 30


def test_run(tmp_path):
    outcomes = stress(run_command(), tmp_path, TRIES)
    assert not verdict(outcomes), verdict(outcomes)


def test_train(tmp_path):
    outcomes = stress(train_command(), tmp_path, TRAIN_TRIES, seed=1)
    assert not verdict(outcomes), verdict(outcomes)


def test_data_prepare(tmp_path):
    outcomes = stress(prepare_command(tmp_path), tmp_path, TRIES, seed=2)
    assert not verdict(outcomes), verdict(outcomes)


def test_doctor(sshd_cluster, tmp_path):
    outcomes = stress(doctor_command(sshd_cluster, tmp_path), tmp_path, TRIES, seed=3)
    assert not verdict(outcomes), verdict(outcomes)


@pytest.mark.timeout(900)
def test_detached_supervisor(tmp_path):
    outcomes = stress(supervisor_command(), tmp_path, TRIES, seed=4)
    assert not verdict(outcomes), verdict(outcomes)

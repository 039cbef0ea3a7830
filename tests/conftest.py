"""Shared pytest fixtures."""

import compileall
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # makes ``fixtures`` importable however pytest is invoked

# --cpu-account: what each test costs in CPU (tests/fixtures/cpu_account.py).
# The real OpenSSH test cluster (127.0.0.11 …) for multi-host tests: ``sshd_cluster`` (session scope).
import pytest
from fixtures.sshd import sshd_cluster  # noqa: F401

from distlaunch import interrupts
from tests.fixtures import cpu_account
from tests.fixtures.cpu_account import pytest_addoption  # noqa: F401

# Job records of the jobs this suite starts go to a folder of its own, never the user's state directory
# (and two suites running at once never see each other's jobs). Set before any test starts a process.
_STATE_DIR = tempfile.mkdtemp(prefix="distlaunch-test-state-")
os.environ["DISTLAUNCH_STATE_DIR"] = _STATE_DIR
# Training runs draw no loss curve here (matplotlib's import is about a second of CPU a run): a test that checks
# the curve asks for it (DISTLAUNCH_LOSS_CURVE=1).
os.environ["DISTLAUNCH_LOSS_CURVE"] = "0"
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Compile distlaunch and the tests' own modules once, before any test starts a Python process.

    Tests start many of them (the CLI, agents, ranks), each importing distlaunch. Where
    PYTHONDONTWRITEBYTECODE is set (this project's machines set it) none may write its bytecode, so each one
    compiled every module it imported again: measured on tests/launcher/test_causes.py and tests/jobs/test_jobs.py,
    83 s before, 67 s with this hook, from a checkout without __pycache__. Up-to-date files are skipped, and each file is written whole
    (atomically), so xdist workers and suites running at once do not get in each other's way.
    """
    for folder in (ROOT / "distlaunch", ROOT / "tests"):
        compileall.compile_dir(folder, quiet=2)
    cpu_account.configure(config)


# The longest files (real training, multi-node and Slurm faults: up to two minutes each) are scheduled first, so
# that none is left running on one pytest-xdist worker at the end while the other has nothing to do.
LONGEST_FIRST = (
    "tests/slurm/test_slurm_requeue.py",  # the longest of all (Slurm's time limits), mostly waiting
    "tests/engine/",
    "tests/signals/",  # every command stopped at 30 moments per signal: minutes of short runs
    "tests/train/",
    "tests/checkpoint/",
    "tests/launcher/test_pernode",
    "tests/slurm/",
    "tests/doctor/test_ground_truth",
    "tests/docs/",  # real training runs behind two examples: about three minutes in one file
)


# ``pytest -m quick``: what a developer runs before every commit (under two minutes on 2 cores with -n 2). The unit
# tests and the CLI's refusals, whole files; then one real job of each kind. CI runs everything.
QUICK = (
    # the plan, the layout, the contracts
    "tests/backends/test_plan_protocol.py",
    "tests/contract/test_entry_points.py",
    "tests/contract/test_extras.py",
    "tests/contract/test_interrupts.py",
    "tests/contract/test_layout.py",
    "tests/contract/test_settings_files.py",
    "tests/contract/test_torch_free.py",
    "tests/contract/test_host_probe.py",
    "tests/launcher/test_plan.py",
    "tests/launcher/test_hostfile.py",
    "tests/launcher/test_elastic.py",
    "tests/launcher/test_store.py",
    "tests/launcher/test_rendezvous_store.py",
    "tests/launcher/test_stragglers.py",
    "tests/launcher/test_debug_log.py",
    # the CLI: its words, its refusals, its screens
    "tests/launcher/test_cli.py",
    "tests/launcher/test_cli_imports.py",
    "tests/launcher/test_80_columns.py",
    "tests/launcher/test_help.py",
    "tests/launcher/test_screens.py",
    "tests/launcher/test_program.py",
    "tests/launcher/test_closed_pipe.py",
    "tests/launcher/test_stream_writer.py",
    "tests/launcher/test_spellings.py",
    "tests/dropin/test_peer_habits.py",
    "tests/train/test_cli.py",
    "tests/train/test_config_values.py",
    "tests/engine/test_config.py",
    "tests/engine/test_metrics.py",
    "tests/engine/test_schedule.py",
    "tests/engine/test_torch_floor.py",
    "tests/checkpoint/test_manifest.py",
    "tests/doctor/test_classify.py",
    "tests/slurm/test_slurm_parsing.py",
    "tests/slurm/test_slurm_env.py",
    "tests/slurm/test_slurm_checks.py",
    "tests/slurm/test_slurm_cli.py",
    "tests/slurm/test_slurm_requeue_cli.py",
    "tests/slurm/test_slurm_saves.py",
    "tests/remote/test_openssh_parts.py",
    "tests/data/test_prepare.py",
    "tests/data/test_prepare_inputs.py",
    "tests/data/test_prepare_out.py",
    "tests/data/test_verify.py",
    # one real job of each kind: local ranks, gloo, SSH hosts, Slurm, the doctor, a detached job, training
    "tests/launcher/test_local_launch.py::test_every_rank_gets_the_torchrun_environment",
    "tests/launcher/test_local_launch.py::test_failing_rank_stops_the_others_and_sets_the_exit_code",
    "tests/launcher/test_local_launch.py::test_torchrun_script_runs_unchanged_with_real_gloo_allreduce",
    "tests/launcher/test_warm_start.py",
    "tests/remote/test_multihost.py::test_env_contract_forwarding_and_quoting_reach_remote_ranks",
    "tests/remote/test_multihost.py::test_ctrl_c_stops_every_rank_on_every_host",
    "tests/slurm/test_slurm_cluster.py",
    "tests/doctor/test_ssh_hosts.py",
    "tests/jobs/test_jobs.py::test_detached_job_is_listed_followed_and_stopped_with_nothing_left",
    "tests/engine/test_entrypoint.py::test_launched_ranks_read_the_env_contract_and_parallel_spec",
)


def pytest_collection_modifyitems(session, config, items):
    """Files whose path starts with one of ``LONGEST_FIRST`` first, in that order; each file's tests together.
    The tests named in ``QUICK`` (a file, or one test with its parameters) get the ``quick`` mark."""

    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if _path(item).startswith(prefix)), len(LONGEST_FIRST))

    for item in items:
        test = f"{_path(item)}::{item.originalname}"
        if _path(item) in QUICK or test in QUICK:
            item.add_marker(pytest.mark.quick)
    items.sort(key=rank)  # stable: the order within a file and among the rest stays as collected


def _path(item) -> str:
    return Path(os.path.relpath(item.path, ROOT)).as_posix()  # never raises, unlike relative_to


KEPT_SIGNALS = (*interrupts.CAUGHT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE)


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """Each test starts as one command in a process of its own does: no signal recorded by an earlier test's
    command (``distlaunch/interrupts.py`` keeps what a command saw in module state). And a test whose in-process
    code leaves a signal handler changed fails: a library call that kept it would change its caller's Ctrl-C."""
    handlers = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}
    interrupts.forget()
    yield
    changed = [signal.Signals(sig).name for sig, handler in handlers.items() if signal.getsignal(sig) != handler]
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    interrupts.forget()
    assert not changed, f"the test left these signal handlers changed: {', '.join(changed)}"


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_STATE_DIR, ignore_errors=True)

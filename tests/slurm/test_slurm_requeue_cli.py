"""Time limits without a cluster: the lines ``slurm sbatch`` writes to outlive one (the warning signal, the requeue),
how far ahead the warning comes (LEAD, computed from the engine's config), the bad values, and the pieces of
``slurm run`` that need no Slurm (the save signal in srun's environment, a rank's saved line, the ignored signal)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from distlaunch.slurm.lead import SLURM_SIGNAL_RESOLUTION_S, time_limit_s
from distlaunch.slurm.savesignal import saved_step
from distlaunch.training.planner import saving
from distlaunch.training.presets import PRESETS
from tests.helpers import invoke

ENGINE = ["-m", "distlaunch.engine", "--set", "checkpoint.dir=ckpt"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def dry_run(*args: str) -> dict:
    r = invoke(["slurm", "sbatch", "--dry-run", "--json", *args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_sbatch_warns_requeues_and_appends_by_default(in_tmp):
    shown = dry_run("-N", "2", "train.py")
    lines = sbatch_lines(shown["script"])
    assert lines[-3:] == ["#SBATCH --signal=B:USR1@180", "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    assert shown["script"].splitlines()[-1].endswith(" slurm run --requeue -- train.py")
    lead = shown["signal_lead"]  # a script distlaunch cannot look into: the documented default
    assert (lead["source"], lead["lead_s"], lead["save_s"]) == ("default", 180, 120.0)
    assert "# LEAD: ceil(120 s to save (not the bundled engine: a default) + 60 s" in shown["script"]


def test_no_requeue_leaves_every_line_out(in_tmp):
    shown = dry_run("-N", "2", "--no-requeue", "train.py")
    assert shown["signal_lead"] is None
    assert not [line for line in shown["script"].splitlines() if "--signal" in line or "requeue" in line.lower()]
    assert "LEAD" not in shown["script"] and "open-mode" not in shown["script"]
    # --save-signal none: nothing to warn with, so nothing to requeue on
    shown = dry_run("-N", "2", "--save-signal", "none", "train.py")
    assert shown["signal_lead"] is None and "--signal=" not in shown["script"]
    assert shown["script"].splitlines()[-1].endswith(" slurm run --save-signal none -- train.py")


def test_signal_lead_replaces_the_computed_one(in_tmp):
    shown = dry_run("-t", "2:00:00", "--signal-lead", "300", *ENGINE)
    assert "#SBATCH --signal=B:USR1@300" in sbatch_lines(shown["script"])
    assert shown["signal_lead"]["source"] == "--signal-lead" and shown["signal_lead"]["estimate"] is None
    shown = dry_run("--save-signal", "USR2", *ENGINE)  # another signal: Slurm sends it, slurm run passes it on
    assert next(line for line in sbatch_lines(shown["script"]) if "signal" in line).startswith(
        "#SBATCH --signal=B:USR2@"
    )
    assert " slurm run --requeue --save-signal USR2 -m -- distlaunch.engine " in shown["script"]


def tiny_params() -> int:
    """The tiny preset's parameters, counted by hand from its shape (not through the planner)."""
    m = PRESETS["tiny"]
    d, v, s, f = m.d_model, m.vocab_size, m.max_seq_len, m.mlp_ratio * m.d_model
    block = 4 * d + 3 * d * d + d * d + 2 * f * d  # two norms (weight, bias), wqkv, wo, fc, proj
    return v * d + s * d + m.n_layer * block + 2 * d + v * d  # tok_emb, pos_emb, blocks, final norm, head


def test_lead_of_the_engine_is_its_save_and_two_steps_plus_slurms_resolution(in_tmp):
    """2 nodes x 1 rank of the tiny preset on CPU, fp32, ZeRO-0: every rank holds the whole checkpoint, so a node
    writes all of it: 4 bytes of weight and 8 of AdamW moments per parameter, 4 per tensor for AdamW's step."""
    lead = dry_run("-N", "2", "--ntasks-per-node", "1", "-t", "10", *ENGINE)["signal_lead"]
    estimate = lead["estimate"]
    params, tensors = tiny_params(), 2 + 8 * PRESETS["tiny"].n_layer + 3
    assert params == 887_040  # the engine reports 3548160 bytes of fp32 parameters for it
    assert estimate["checkpoint_bytes"] == estimate["node_bytes"] == 12 * params + 4 * tensors
    save_s = estimate["node_bytes"] / saving.WRITE_BYTES_PER_S + saving.SAVE_OVERHEAD_S
    # one step: 6 FLOPs per multiplying weight per token (the embedding lookups are not) + 12*L*d*T, x 16 x 128 tokens
    m = PRESETS["tiny"]
    per_token = 6 * (params - (m.vocab_size + m.max_seq_len) * m.d_model) + 12 * m.n_layer * m.d_model * 128
    assert estimate["step_flops"] == per_token * 16 * 128
    step_s = estimate["step_flops"] / (2 * saving.CPU_FLOPS_PER_S) + saving.STEP_OVERHEAD_S
    assert estimate["save_s"] == pytest.approx(save_s, abs=1e-3) and estimate["step_s"] == pytest.approx(
        step_s, abs=1e-3
    )
    expected = math.ceil(save_s + 2 * step_s + SLURM_SIGNAL_RESOLUTION_S)
    assert (lead["source"], lead["lead_s"]) == ("engine config", expected) and expected == 66
    assert lead["how"].endswith(f"+ 60 s Slurm's signal resolution) = {expected} s")


def test_lead_grows_with_the_model_and_shrinks_with_the_nodes_share(in_tmp):
    big = ["--set", "model.preset='125m'", "--set", "train.seq_len=1024", "--set", "train.global_batch_size=64"]
    one_node = dry_run("-N", "1", "--ntasks-per-node", "8", "--gpus-per-node", "8", *ENGINE, *big)["signal_lead"]
    zero3 = dry_run("-N", "4", "--ntasks-per-node", "2", "--gpus-per-node", "2", "--parallel", "zero=3", *ENGINE, *big)
    sharded = zero3["signal_lead"]["estimate"]
    assert one_node["estimate"]["node_bytes"] == one_node["estimate"]["checkpoint_bytes"]  # all of it on one node
    # ZeRO-3 over 4 nodes: a node holds a quarter of the weights and moments (rows padded to dp, so a little more)
    assert sharded["checkpoint_bytes"] / 4 <= sharded["node_bytes"] < sharded["checkpoint_bytes"] / 3.9
    assert one_node["lead_s"] > zero3["signal_lead"]["lead_s"] > SLURM_SIGNAL_RESOLUTION_S


@pytest.mark.parametrize(
    "args, message",
    [
        (["--signal-lead", "abc", "train.py"], "error: --signal-lead 'abc' is not a whole number of seconds (hint: "),
        (["--signal-lead", "0", "train.py"], "error: --signal-lead 0 is out of range: Slurm warns the job 1 to 65535"),
        (["--signal-lead", "70000", "train.py"], "error: --signal-lead 70000 is out of range"),
        (["--no-requeue", "--signal-lead", "60", "train.py"], "error: --signal-lead with --no-requeue: nothing is"),
        (["--save-signal", "TERM", "train.py"], "error: --save-signal 'TERM': SIGTERM is not one distlaunch can take"),
        (["-t", "1", *ENGINE], "error: --time 1 is 60 s, and the save signal 68 s before the end (ceil(save "),
        (["-t", "0:30", "--signal-lead", "21", "train.py"], "error: --time 0:30 is 60 s, and the save signal 21 s "),
    ],
)
def test_bad_values_are_one_line_and_exit_2(in_tmp, args, message):
    r = invoke(["slurm", "sbatch", "--dry-run", *args])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(message) and "(hint: " in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_time_limit_that_leaves_room_for_the_warning_is_taken(in_tmp):
    # the warning comes 20 to 50 s before the end of a 1-minute job: at least 10 s into the run
    assert "#SBATCH --signal=B:USR1@20" in dry_run("-t", "1", "--signal-lead", "20", "train.py")["script"]
    r = invoke(["slurm", "sbatch", "--dry-run", "-t", "1", "--signal-lead", "21", "train.py"])
    assert (
        r.exit_code == 2 and "(hint: give a --time of at least 61 s, a --signal-lead of at most 20 s, or " in r.stderr
    )


@pytest.mark.parametrize(
    "text, seconds",
    [("1", 60), ("0:30", 60), ("90", 5400), ("1:30:00", 5400), ("2-0", 172800), ("1-2:30", 95400),
     ("1-0:0:1", 86460), ("UNLIMITED", None), (None, None), ("1:xx", None)],
)  # fmt: skip
def test_slurm_time_limits_in_seconds(text, seconds):
    assert time_limit_s(text) == seconds  # Slurm keeps whole minutes, rounded up


def test_slurm_run_gives_every_rank_the_save_signal(in_tmp):
    r = invoke(["slurm", "run", "--dry-run", "--json", "-N", "2", *ENGINE])
    job = json.loads(r.stdout)
    assert (job["save_signal"], job["saves_on_signal"], job["requeue"]) == ("USR1", True, False)
    job = json.loads(invoke(["slurm", "run", "--dry-run", "--json", "--requeue", "train.py"]).stdout)
    assert (job["save_signal"], job["saves_on_signal"], job["requeue"]) == ("USR1", False, True)  # a plain script
    typed = json.loads(invoke(["slurm", "run", "--dry-run", "--json", "--save-signal", "usr2", "train.py"]).stdout)
    assert (typed["save_signal"], typed["saves_on_signal"]) == ("USR2", True)  # typed: the script saves on it
    off = json.loads(invoke(["slurm", "run", "--dry-run", "--json", "--save-signal", "none", *ENGINE]).stdout)
    assert (off["save_signal"], off["saves_on_signal"]) == (None, False)
    # where srun would not export everything, the save and checkpoint signals' variables are named (never a value)
    r = invoke(["slurm", "run", "--dry-run", "train.py"], env={"SLURM_EXPORT_ENV": "NONE"})
    assert " --export=DISTLAUNCH_SAVE_SIGNAL,DISTLAUNCH_CHECKPOINT_SIGNAL " in r.stdout, r.stdout
    assert "--export" not in invoke(["slurm", "run", "--dry-run", "train.py"]).stdout


@pytest.mark.parametrize(
    "line, found",
    [
        ("0: saved the checkpoint of step 41 (asked by SIGUSR1); stopping here\n", (0, 41)),
        (" 3: saved the checkpoint of step 7\n", (3, 7)),  # srun pads the label with 10 tasks or more
        ("0: step 41/100 | loss 2.1\n", None),
        ("saved the checkpoint of step 41\n", None),  # not a rank's line
    ],
)
def test_a_ranks_saved_line_as_srun_labels_it(line, found):
    assert saved_step(line) == found


def test_a_rank_starts_with_the_save_signal_ignored_until_it_traps_it():
    """task.py sets the save signal to SIG_IGN before the exec: the program starts with it ignored (a signal that
    comes while it imports torch does not kill it), and a handler it sets replaces that."""
    code = (
        "import os, sys; from distlaunch.slurm.task import ignore_save_signal; "
        "ignore_save_signal({'DISTLAUNCH_SAVE_SIGNAL': 'USR1'}); "
        "os.execv(sys.executable, [sys.executable, '-c', "
        "'import os, signal; print(signal.getsignal(signal.SIGUSR1)); os.kill(os.getpid(), signal.SIGUSR1); "
        'print("alive")\'])'
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(signal.Handlers.SIG_IGN), "alive"]

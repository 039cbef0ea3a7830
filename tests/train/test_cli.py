"""``distlaunch train`` before anything starts: config errors, templates, the plan and the memory planner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distlaunch.launcher.planning.train import EMBEDDED_CONFIG, parse_size
from distlaunch.training.config import load_config, read_config_file
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.planner import plan_memory, rank_tensors
from distlaunch.training.presets import PRESETS
from tests.helpers import invoke

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = {  # template -> the world size it is written for
    "train-tiny-cpu.toml": 4,
    "train-125m-8gpu.toml": 8,
    "train-1.3b-3d.toml": 16,
}


def _one_line_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args,words",
    [
        (["--set", "train.stepz=3"], ["unknown config key 'train.stepz'", "train.steps"]),
        (["--set", "train.precision=fp8"], ["train.precision", "'fp32', 'bf16' or 'fp16'"]),
        (["--set", "train.lr_schedule=linear"], ["train.lr_schedule", "'cosine' or 'constant'"]),
        (["--set", "data.format=parquet"], ["data.format", "'auto', 'text' or 'tokens'"]),
        (["--set", "parallel.tp=2", "--parallel", "tp=4"], ["conflicts", "parallel.tp=2", "tp=4"]),
        (["--parallel", "tp=two"], ["--parallel", "not an integer"]),
        (["--parallel", "schedule=zigzag"], ["schedule='zigzag' is not a schedule", "gpipe, 1f1b, interleaved"]),
        (["-n", "3", "--set", "train.global_batch_size=16"], ["global_batch_size=16 is not divisible by dp=3"]),
        (["-n", "4", "--parallel", "dp=3"], ["dp(3)*tp(1)*pp(1) = 3 != world size 4"]),
        (["--set", "parallel.tp=3", "--set", "parallel.pp=1", "--set", "parallel.dp=1"], ["tp=3 does not divide"]),
        (["--set", "train.grad_accum_steps=3"], ["grad_accum_steps=3"]),
        (["nope.toml"], ["config file not found"]),
        (["--gpu-memory", "lots"], ["--gpu-memory 'lots' is not a size"]),
    ],
)
def test_config_mistakes_are_one_line_and_exit_2_before_any_process(args, words):
    _one_line_error(invoke(["train", "--dry-run", *args]), *words)


@pytest.mark.parametrize("name,world_size", TEMPLATES.items())
def test_templates_validate_and_ship_with_the_package(name, world_size):
    top, packaged = ROOT / "templates" / name, ROOT / "distlaunch" / "templates" / name
    assert top.samefile(packaged)  # one source of truth, as for sbatch.sh
    cfg = load_config(packaged)
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    assert dims.world_size == world_size


def test_embedded_default_exercises_more_than_data_parallelism():
    cfg = load_config(EMBEDDED_CONFIG)
    assert cfg.model.preset == "tiny" and cfg.parallel.dp == 2 and cfg.parallel.tp * cfg.parallel.pp == 2


def test_a_bare_train_trains_what_the_engine_trains_with_no_config():
    """One owner of the training defaults (training/config.py): every rank of ``distlaunch train`` loads the
    engine's own defaults, as ``python -m distlaunch.engine`` with no config does under the same launcher, but
    for what the demo job adds: its layout (DISTLAUNCH_PARALLEL, which the engine reads too), its micro-batch
    size (4 pipeline micro-batches; the same gradients as 2 bigger ones) and how often it reports (which changes
    no step it trains)."""
    plan = json.loads(invoke(["train", "--dry-run", "--json"]).stdout)
    rank = plan["nodes"][0]["ranks"][0]
    argv = rank["argv"][rank["argv"].index("distlaunch.engine") + 1 :]
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    layout = rank["env"]["DISTLAUNCH_PARALLEL"]
    trained = load_config(argv[0], sets, layout)
    demo = ["train.micro_batch_size=2", "train.log_every=10", "train.eval_every=50"]
    assert trained == load_config(None, demo, layout)
    assert (trained.train.lr, trained.train.warmup_steps, trained.train.weight_decay) == (3e-3, 20, 0.1)
    assert (trained.train.steps, trained.train.log_every, trained.train.eval_every) == (200, 10, 50)
    # the template states no default of its own: only the demo's additions, beside its [parallel] table
    written = {f"{table}.{key}" for table, keys in read_config_file(EMBEDDED_CONFIG).items() for key in keys}
    added = {"model.preset", *(assignment.partition("=")[0] for assignment in demo)}
    assert {key for key in written if not key.startswith("parallel.")} == added


@pytest.mark.parametrize(
    "args,world_size,layout",
    [
        (["-n", "1"], 1, {"dp": 1, "tp": 1, "pp": 1, "zero": 1}),
        (["-n", "8", "--parallel", "dp=2,tp=2,pp=2"], 8, {"dp": 2, "tp": 2, "pp": 2, "zero": 1, "schedule": "1f1b"}),
        (["--parallel", "dp=2,tp=2"], 4, {"dp": 2, "tp": 2, "pp": 1, "zero": 1}),
        (["--set", "parallel.tp=2"], 2, {"dp": 1, "tp": 2, "pp": 1, "zero": 1}),
        (["--resume", "never", "--parallel", "dp=2,tp=2"], 4, {"dp": 2, "tp": 2, "pp": 1, "zero": 1}),
        (["--parallel", "zero=3"], 4, {"dp": 2, "tp": 1, "pp": 2, "zero": 3, "schedule": "1f1b"}),
        (
            ["--parallel", "schedule=gpipe,microbatches=8"],
            4,
            {"dp": 2, "tp": 1, "pp": 2, "zero": 1, "schedule": "gpipe", "microbatches": 8},
        ),
    ],
)
def test_the_command_line_replaces_the_embedded_layout(args, world_size, layout):
    """The embedded dp=2 x pp=2 is what runs with no options; what the user writes replaces it, never conflicts."""
    result = invoke(["train", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == world_size and plan["parallel"] == layout
    # every rank re-reads the config from its argv and DISTLAUNCH_PARALLEL: it must come to the same layout
    rank = plan["nodes"][0]["ranks"][0]
    argv = rank["argv"][rank["argv"].index("distlaunch.engine") + 1 :]
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    cfg = load_config(argv[0], sets, rank["env"]["DISTLAUNCH_PARALLEL"])
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    assert (dims.dp, dims.tp, dims.pp, dims.zero) == tuple(layout[k] for k in ("dp", "tp", "pp", "zero"))
    if "microbatches" in layout:
        assert (dims.schedule, dims.microbatches) == (layout["schedule"], layout["microbatches"])


def test_a_users_own_config_file_conflicts_with_a_different_flag(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text("[parallel]\ndp = 2\npp = 2\n", encoding="utf-8")
    _one_line_error(
        invoke(["train", str(mine), "--dry-run", "--parallel", "pp=1"]), "parallel.pp=2 in the config conflicts"
    )
    plan = json.loads(invoke(["train", str(mine), "--dry-run", "--json", "--parallel", "zero=2"]).stdout)
    assert plan["world_size"] == 4 and plan["parallel"]["zero"] == 2  # keys the file leaves open are the flag's


def test_the_layout_reaches_ranks_by_one_channel(tmp_path):
    """A --set that overrides a key of the user's file: the ranks get it through DISTLAUNCH_PARALLEL alone, which
    outranks the file there, so the rank's own reading of file + argv + env comes to the launcher's layout."""
    mine = tmp_path / "mine.toml"
    mine.write_text("[parallel]\ndp = 2\npp = 2\nzero = 1\n", encoding="utf-8")
    plan = json.loads(invoke(["train", str(mine), "--dry-run", "--json", "--set", "parallel.zero=2"]).stdout)
    rank = plan["nodes"][0]["ranks"][0]
    argv = rank["argv"][rank["argv"].index("distlaunch.engine") + 1 :]
    assert argv == [str(mine)] and rank["env"]["DISTLAUNCH_PARALLEL"].startswith("dp=2,tp=1,pp=2,zero=2")
    assert load_config(argv[0], [], rank["env"]["DISTLAUNCH_PARALLEL"]).parallel.zero == 2


def test_dry_run_json_has_a_memory_estimate_per_rank():
    result = invoke(["train", "--dry-run", "--json", "--set", "parallel.zero=2"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 4
    assert plan["parallel"] == {"dp": 2, "tp": 1, "pp": 2, "zero": 2, "schedule": "1f1b"}
    rank = plan["nodes"][0]["ranks"][0]
    assert rank["argv"][1:] == ["-m", "distlaunch.engine", str(EMBEDDED_CONFIG)]  # the layout: one channel, the env
    assert rank["env"]["DISTLAUNCH_PARALLEL"] == "dp=2,tp=1,pp=2,zero=2,schedule=1f1b"
    memory = plan["memory"]
    assert memory["device"] == "no GPU: host memory" and [r["rank"] for r in memory["ranks"]] == [0, 1, 2, 3]
    for r in memory["ranks"]:
        parts = r["params"] + r["grads"] + r["optimizer"] + r["activations"] + r["buffers"]
        # the peak is one moment's sum: at least the state no step frees, at most every part at once
        assert r["params"] + r["optimizer"] < r["peak"] <= parts and r["fits"] is True
        assert r["peak_at"] in ("backward", "gradient sync", "optimizer step")


def test_dry_run_table_says_whether_it_fits_the_gpu():
    config = str(ROOT / "templates" / "train-1.3b-3d.toml")
    small = invoke(["train", config, "-n", "16", "--backend", "nccl", "--dry-run", "--gpu-memory", "2GiB"])
    assert small.exit_code == 2, small.stderr  # a plan that does not fit is a failed dry run
    assert "memory per rank in GiB (bf16, zero=1" in small.stdout and "does not fit" in small.stdout
    assert "0-7" in small.stdout and "8-15" in small.stdout  # ranks with equal estimates share a row
    big = invoke(["train", config, "-n", "16", "--backend", "nccl", "--dry-run", "--json", "--gpu-memory", "80GiB"])
    memory = json.loads(big.stdout)["memory"]
    assert (
        memory["fits"] is True
        and memory["capacity_bytes"] == 80 * 2**30
        and memory["capacity_source"] == "--gpu-memory"
    )


def test_planner_state_per_zero_stage():
    """Adam state per rank for Ψ parameters on N ranks. fp32: the weights are their own master
    copy, 16Ψ -> 8Ψ+8Ψ/N -> 4Ψ+12Ψ/N -> 16Ψ/N. bf16: ZeRO-0/1/2 hold 2-byte weights, fp32
    gradients and an fp32 master beside the moments (sharded with them); ZeRO-3's sharded fp32
    weights are the master."""
    model, n = PRESETS["1.3b"], 8
    expected = {
        "fp32": {0: 16, 1: 8 + 8 / n, 2: 4 + 12 / n, 3: 16 / n},
        "bf16": {0: 18, 1: 6 + 12 / n, 2: 2 + 16 / n, 3: 16 / n},
    }
    for precision, per_stage in expected.items():
        for zero, bytes_per_param in per_stage.items():
            sets = [f"parallel.zero={zero}", "train.global_batch_size=8", "train.seq_len=2048"]
            cfg = load_config(None, [*sets, f"train.precision='{precision}'"])
            dims = resolve_parallel_dims(cfg, model, n)
            rank = plan_memory(model, dims, cfg.train, "nccl", "gpu", None, "unknown").ranks[0]
            psi = sum(t.numel for t in rank_tensors(model, dims, 0))
            state = (rank.params + rank.grads + rank.optimizer) / psi
            assert abs(state - bytes_per_param) < 1e-2, (precision, zero, state, bytes_per_param)


def test_sizes():
    assert parse_size("80GiB") == 80 * 2**30 and parse_size("40GB") == 40 * 10**9
    assert parse_size("24576MiB") == 24 * 2**30 and parse_size("1024") == 1024


def test_help_and_dry_run_never_import_torch():
    code = (
        "import sys; from distlaunch.cli.app import main; "
        "main(['train', '--help']); main(['train', '--dry-run', '--json']); print('TORCH', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "TORCH False" in out.stdout and '"memory"' in out.stdout


def test_auto_backend_trains_on_the_cpu_where_gpus_are_fewer_than_ranks():
    """The embedded 4-rank default on a 1-GPU workstation trains on the CPU, and says so; a GPU per
    rank, no GPU, a hostfile (other hosts' GPUs) or an explicit --backend keep the usual rule."""
    from distlaunch.launcher.planning.train import train_backend

    backend, why = train_backend("auto", None, 4, 1)
    assert backend == "gloo" and why.startswith("4 ranks but 1 GPU here: training on the CPU with gloo")
    assert "-n 1" in why
    assert train_backend("auto", None, 4, 4) == ("auto", None)  # nccl, one GPU per rank
    assert train_backend("auto", None, 4, 0) == ("auto", None)  # gloo, no GPU
    assert train_backend("auto", Path("hosts"), 4, 1) == ("auto", None)
    assert train_backend("nccl", None, 4, 1) == ("nccl", None)  # asked for: rank 1 on says it has no GPU


@pytest.mark.parametrize(
    "args,line",
    [
        (["--steps", "10"], "--steps is not an option (hint: use --set train.steps=10)"),
        (["--max-steps=20"], "--max-steps is not an option (hint: use --set train.steps=20)"),
        (["--max_steps", "5"], "--max-steps is not an option (hint: use --set train.steps=5)"),  # torchrun's spelling
        (["--lr", "3e-4"], "--lr is not an option (hint: use --set train.lr=3e-4)"),
        (["--learning-rate"], "--learning-rate is not an option (hint: use --set train.lr=VALUE)"),
        (["--micro-batch-size", "2"], "--micro-batch-size is not an option (hint: use --set train.micro_batch_size=2)"),
        (["--batch-size", "32"], "(hint: use --set train.global_batch_size=32: all ranks' batch together; "),
        (["--epochs", "3"], "(hint: use --set train.steps=N: distlaunch train counts steps, not epochs)"),
        (["--bf16"], "--bf16 is not an option (hint: use --set train.precision=bf16)"),
    ],
)
def test_another_trainers_flag_is_answered_with_its_set_spelling(args, line):
    r = invoke(["train", *args, "--dry-run"])
    _one_line_error(r)
    assert r.stderr.startswith("error: distlaunch train: ") and line in r.stderr, r.stderr


def test_every_trainer_flag_names_a_real_config_key():
    from distlaunch.training.aliases import KEY_ALIASES, SETTING_ALIASES
    from distlaunch.training.config import TrainingConfig

    keys = {f"{s}.{k}" for s, f in TrainingConfig.model_fields.items() for k in f.annotation.model_fields}
    assert set(KEY_ALIASES.values()) <= keys
    for assignment in SETTING_ALIASES.values():
        key, _, value = assignment.partition("=")
        assert key in keys
        if value in ("bf16", "fp16"):  # a switch's value loads as it is
            assert load_config(None, [assignment]).train.precision == value


def test_a_flag_of_no_trainer_is_still_no_such_option():
    r = invoke(["train", "--frobnicate", "--dry-run"])
    _one_line_error(r)
    assert "No such option: --frobnicate" in r.stderr


@pytest.mark.parametrize("nproc", [1, 3, 5, 8, 16, 24, 64])
def test_the_bundled_model_plans_on_any_world_size_and_says_which_batch_it_chose(nproc):
    """No config, ranks given: the embedded batch is fitted to them (only what the user wrote is ever refused)."""
    r = invoke(["train", "-n", str(nproc), "--dry-run"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stdout + r.stderr
    (line,) = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("batch:")]
    global_batch = int(line.split()[1])
    assert global_batch >= 16 and global_batch % nproc == 0 and (global_batch // nproc) % 2 == 0, line
    assert ("raised to fit" in line) == (global_batch != 16), line
    assert f"{nproc} dp rank" in line, line


def test_a_hostfile_of_two_8_gpu_nodes_plans_the_bundled_model():
    r = invoke(["train", "-H", str(ROOT / "hostfiles" / "two-nodes-8-gpus.txt"), "--dry-run"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "batch: 32 sequences per step, 2 per dp rank as 1 micro-batch of 2" in r.stdout


def test_a_batch_the_user_wrote_is_refused_not_fitted():
    _one_line_error(
        invoke(["train", "-n", "16", "--set", "train.global_batch_size=8", "--dry-run"]),
        "train.global_batch_size=8 is not divisible by dp=16",
    )


def test_the_embedded_default_keeps_its_own_batch_and_says_nothing_of_it():
    r = invoke(["train", "--dry-run"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "batch:" not in r.stdout, r.stdout + r.stderr


def test_a_dry_run_whose_plan_does_not_fit_says_so_in_one_line_and_exits_2():
    args = [
        "train",
        str(ROOT / "templates" / "train-1.3b-3d.toml"),
        "-H",
        str(ROOT / "hostfiles" / "two-nodes-8-gpus.txt"),
    ]
    small = invoke([*args, "--gpu-memory", "1GiB", "--dry-run"], env={"COLUMNS": "200"})
    assert "the step peak does not fit" in small.stdout
    _one_line_error(small, "the plan does not fit: rank", "over 90% of 1.00 GiB per rank", "activation_checkpointing")
    assert invoke([*args, "--gpu-memory", "80GiB", "--dry-run", "--json"]).exit_code == 0
    assert invoke([*args, "--gpu-memory", "1GiB", "--dry-run", "--json"]).exit_code == 2

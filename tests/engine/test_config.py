"""Config loading, --set overrides, DISTLAUNCH_PARALLEL, and layouts refused before start."""

from __future__ import annotations

import pytest

from distlaunch.contract.layout import parse_layout
from distlaunch.engine.model import PRESETS, GPTConfig, num_params
from distlaunch.engine.parallel.mesh import read_env
from distlaunch.engine.parallel.pipeline import bubble_fraction, stage_layer_counts
from distlaunch.errors import UsageError
from distlaunch.training.config import Preset, load_config
from distlaunch.training.dims import resolve_parallel_dims, shards_vocab_over_dp

TINY = PRESETS["tiny"]


def dims_for(world_size: int, *overrides: str, model: GPTConfig = TINY):
    return resolve_parallel_dims(load_config(None, list(overrides)), model, world_size)


def test_toml_file_and_set_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "small"\n[train]\nsteps = 7\nlr = 3e-4\n[parallel]\nschedule = "gpipe"\n')
    cfg = load_config(path, ["train.steps=9", "parallel.schedule=interleaved", "data.path=/x y.txt"])
    assert (cfg.model.preset, cfg.train.steps, cfg.train.lr) == ("small", 9, 3e-4)
    assert cfg.parallel.schedule == "interleaved"  # an unquoted string is taken as a string
    assert cfg.data.path == "/x y.txt"


@pytest.mark.parametrize(
    "override,words",
    [
        ("train.stepz=3", ["train.stepz", "train.steps"]),
        ("trian.steps=3", ["trian", "train"]),
        ("model.preset=huge", ["model.preset", "'huge'", "tiny", "1.3b"]),
        ("parallel.zero=4", ["parallel.zero", "0, 1, 2 or 3"]),
        ("parallel.schedule=zigzag", ["parallel.schedule", "gpipe", "1f1b", "interleaved"]),
        ("train.precision=fp8", ["train.precision", "bf16"]),
        ("train.steps=0", ["train.steps", "greater than or equal to 1"]),
        ("fault.kind=explode", ["fault.kind", "crash-in-save"]),
        ("trainsteps", ["section.key=value"]),
    ],
)
def test_config_errors_name_the_key_and_the_allowed_values(override, words):
    with pytest.raises(UsageError) as err:
        load_config(None, [override])
    text = str(err.value)
    assert "\n" not in text and err.value.hint
    for word in words:
        assert word in text


@pytest.mark.parametrize(
    "key,meant",
    [
        ("train.stepz", "did you mean train.steps?"),  # a typo
        ("train.lr_scedule", "did you mean train.lr_schedule?"),
        ("parallel.zer", "did you mean parallel.zero?"),
        ("train.preset", "did you mean model.preset?"),  # a key of another section
        ("train.learning_rate", "did you mean train.lr?"),  # another trainer's name for it
        ("train.max_steps", "did you mean train.steps?"),
        ("trian.steps", "did you mean [train]?"),  # a section
    ],
)
def test_an_unknown_key_names_the_one_it_most_likely_meant(key, meant, tmp_path):
    with pytest.raises(UsageError) as err:
        load_config(None, [f"{key}=1"])
    assert err.value.hint == meant, str(err.value)
    section, _, name = key.partition(".")
    path = tmp_path / "run.toml"  # the same from a config file
    path.write_text(f"[{section}]\n{name} = 1\n")
    with pytest.raises(UsageError) as err:
        load_config(path)
    assert err.value.hint == meant, str(err.value)


def test_an_unknown_key_near_none_lists_its_section():
    with pytest.raises(UsageError) as err:
        load_config(None, ["train.zzqqxx=1"])
    assert err.value.hint.startswith("keys in [train] are: train.steps, ") and "did you mean" not in err.value.hint
    with pytest.raises(UsageError) as err:
        load_config(None, ["zzqqxx.steps=1"])
    assert err.value.hint == "sections are: model, train, parallel, data, checkpoint, fault"


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps=1\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_config(bad)


def test_launcher_parallel_env_fills_and_conflicts():
    cfg = load_config(None, [], "dp=2,tp=2,pp=2,zero=1")
    assert (cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.zero) == (2, 2, 2, 1)
    assert load_config(None, ["parallel.tp=2"], "dp=2,tp=2").parallel.tp == 2  # same value: fine
    with pytest.raises(UsageError, match="conflicts") as err:
        load_config(None, ["parallel.zero=3"], "dp=2,zero=1")
    assert "parallel.zero=3" in str(err.value) and "zero=1" in str(err.value)
    assert parse_layout("dp=auto,tp=2") == {"dp": None, "tp": 2}
    assert load_config(None, [], "dp=auto,tp=2").parallel.dp is None
    with pytest.raises(UsageError, match="DISTLAUNCH_PARALLEL 'dp=2,xp=2': unknown entry"):
        load_config(None, [], "dp=2,xp=2")
    assert load_config(None, ["parallel.dp=auto"]).parallel.dp is None  # --set speaks the same grammar


@pytest.mark.parametrize(
    "world,overrides,message",
    [
        (8, ["parallel.dp=2", "parallel.tp=2", "parallel.pp=3"], r"dp\(2\)\*tp\(2\)\*pp\(3\) = 12 != world size 8"),
        (6, ["parallel.tp=4"], r"world size 6 is not divisible by tp\(4\)\*pp\(1\)=4"),
        (3, ["parallel.tp=3"], "does not divide the model's 4 attention heads"),
        (8, ["parallel.pp=8", "train.global_batch_size=8"], "8 pipeline stages .* only 4 layers"),
        (4, ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.virtual_stages=4"], "8 pipeline stages"),
        (2, ["parallel.pp=2", "parallel.microbatches=1"], "1 micro-batches for 2 pipeline stages"),
        (
            2,
            ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.microbatches=3", "train.global_batch_size=6"],
            "multiple of pp=2",
        ),
        (2, ["parallel.schedule=interleaved", "parallel.virtual_stages=1"], "at least 2 virtual stages"),
        (4, ["train.global_batch_size=6"], "not divisible by dp=4"),
        (1, ["train.global_batch_size=8", "train.micro_batch_size=3"], "cannot be split into"),
        (
            1,
            ["train.micro_batch_size=2", "parallel.microbatches=2", "train.global_batch_size=8"],
            r"!= global_batch_size/dp",
        ),
        (1, ["train.seq_len=4096"], "exceeds the model's max_seq_len=256"),
    ],
)
def test_layouts_that_cannot_work_are_refused_before_start(world, overrides, message):
    with pytest.raises(UsageError, match=message) as err:
        dims_for(world, *overrides)
    assert err.value.hint


def test_vocab_not_divisible_by_tp_is_refused():
    odd_vocab = GPTConfig(n_layer=2, n_head=6, d_model=48, vocab_size=250)
    with pytest.raises(UsageError, match="vocabulary size 250"):
        dims_for(3, "parallel.tp=3", model=odd_vocab)


def test_every_dp_tp_pp_zero_combination_of_8_ranks_resolves_or_is_refused_by_rule():
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            for zero in range(4):
                if 8 % (tp * pp):
                    continue
                args = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.zero={zero}", "train.global_batch_size=16"]
                if tp > TINY.n_head or pp > TINY.n_layer:
                    with pytest.raises(UsageError):
                        dims_for(8, *args)
                else:
                    dims = dims_for(8, *args)
                    assert dims.dp * dims.tp * dims.pp == 8 and dims.microbatches >= pp


def test_microbatch_resolution():
    assert dims_for(2, "train.global_batch_size=8", "train.micro_batch_size=2").microbatches == 2
    d = dims_for(2, "parallel.pp=2", "train.global_batch_size=8", "parallel.microbatches=4")
    assert (d.microbatches, d.micro_batch_size, d.dp) == (4, 2, 1)
    assert dims_for(4, "parallel.pp=4", "train.global_batch_size=8").microbatches == 4  # default: pp


def test_stage_layer_counts_are_balanced():
    assert stage_layer_counts(4, 4) == [1, 1, 1, 1]
    assert stage_layer_counts(10, 4) == [2, 3, 3, 2]  # spare blocks to the middle stages
    assert stage_layer_counts(5, 2) == [2, 3]
    for n_layer in range(1, 30):
        for n_stages in range(1, n_layer + 1):
            counts = stage_layer_counts(n_layer, n_stages)
            assert sum(counts) == n_layer and max(counts) - min(counts) <= 1


def test_bubble_fraction():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)  # (p-1)/(m+p-1)
    assert bubble_fraction(4, 4, virtual_stages=2) < bubble_fraction(4, 4)


def test_read_env():
    assert read_env({}).launched is False
    env = read_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (env.rank, env.world_size, env.local_rank, env.launched) == (3, 4, 1, True)
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        read_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="outside"):
        read_env({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def test_presets_and_sizes():
    assert set(PRESETS) == set(Preset.__args__)
    sizes = {name: num_params(cfg) for name, cfg in PRESETS.items()}
    assert 0.7e6 < sizes["tiny"] < 1.3e6 and 25e6 < sizes["small"] < 40e6
    assert sizes["tiny"] < sizes["small"] < sizes["125m"] < sizes["350m"] < sizes["1.3b"]
    for cfg in PRESETS.values():  # every preset runs with tp up to 4 (heads and vocab divisible)
        assert cfg.d_model % cfg.n_head == 0 and cfg.n_head % 4 == 0 and cfg.vocab_size % 4 == 0


@pytest.mark.parametrize(
    ("overrides", "world", "sharded"),
    [
        (["parallel.zero=3", "train.seq_len=64"], 4, True),  # 4 x 1 x 64 = 256 tokens <= 50,304 rows
        (["parallel.zero=2", "train.seq_len=64"], 4, False),  # ZeRO-0/1/2 keep the whole table
        (["parallel.zero=3", "parallel.tp=2", "train.seq_len=64"], 4, False),  # tp: vocab-parallel over tp
        (["parallel.zero=3", "train.seq_len=64"], 1, False),  # dp=1: nothing to shard over
        (["parallel.zero=3", "train.seq_len=2048", "train.global_batch_size=32"], 4, False),  # 4x8x2048 > 50,304
    ],
)
def test_zero3_shards_the_vocabulary_tables_over_dp_where_that_moves_fewer_bytes(overrides, world, sharded):
    model = PRESETS["125m"]
    cfg = load_config(None, ["model.preset='125m'", "train.global_batch_size=4", *overrides])
    dims = resolve_parallel_dims(cfg, model, world)
    assert shards_vocab_over_dp(dims, cfg.train.seq_len, model.vocab_size) is sharded

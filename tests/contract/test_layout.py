import inspect
import sys
import types

import pytest

from distlaunch.contract import layout as contract
from distlaunch.contract.layout import (
    DEGREES,
    GRID,
    LAYOUT_KEYS,
    Layout,
    LayoutSpec,
    groups,
    layout_spec,
    mesh_shape,
    parse_layout,
    place_of,
    rank_of,
    resolve_layout,
    spelling,
)
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import host_layout
from distlaunch.launcher.planning.train import parallel_spec
from distlaunch.training.config import ParallelSection, load_config
from distlaunch.training.dims import ParallelDims


def test_one_grammar_for_shape_zero_and_pipeline():
    assert parse_layout("dp=auto,tp=2,schedule=interleaved,microbatches=8,virtual_stages=2") == {
        "dp": None,
        "tp": 2,
        "schedule": "interleaved",
        "microbatches": 8,
        "virtual_stages": 2,
    }
    layout = resolve_layout(layout_spec("tp=2,pp=2,schedule=gpipe,microbatches=4"), 8)
    assert str(layout) == "dp=2,tp=2,pp=2,zero=0,schedule=gpipe,microbatches=4"  # what DISTLAUNCH_PARALLEL carries
    assert layout_spec(str(layout)) == LayoutSpec(**layout.model_dump())  # and it reads back the same
    assert str(Layout(dp=4, tp=1, pp=1)) == "dp=4,tp=1,pp=1,zero=0"


def test_parse_full_and_partial_specs():
    assert layout_spec("dp=2,tp=2,pp=2,zero=1") == LayoutSpec(dp=2, tp=2, pp=2, zero=1)
    assert layout_spec("tp=4") == LayoutSpec(dp=None, tp=4)
    assert layout_spec("dp=auto, zero=3") == LayoutSpec(dp=None, zero=3)
    assert layout_spec(None) == LayoutSpec()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("dp=2,xp=2", "unknown entry 'xp=2'"),
        ("zero=4", "zero=4 is not a ZeRO stage"),
        ("tp=0", "tp=0 must be at least 1"),
        ("tp=two", "tp='two' is not an integer"),
        ("dp=2,dp=4", "dp is given twice"),
        ("tp", "unknown entry 'tp'"),
        ("schedule=zigzag", "schedule='zigzag' is not a schedule"),
        ("microbatches=0", "microbatches=0 must be at least 1"),
    ],
)
def test_parse_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        layout_spec(text)


def test_auto_dp_fills_the_world():
    assert resolve_layout(layout_spec("dp=auto,tp=2,pp=2"), 16).dp == 4
    assert resolve_layout(LayoutSpec(), 6).dp == 6


def test_product_must_equal_world_size_with_the_fix():
    with pytest.raises(UsageError) as info:
        resolve_layout(layout_spec("dp=2,tp=2,pp=3"), 8)
    assert "dp(2)*tp(2)*pp(3) = 12 != world size 8" in info.value.message
    with pytest.raises(UsageError, match="not divisible"):
        resolve_layout(layout_spec("tp=3"), 8)


def test_groups_tp_fastest_then_dp_then_pp():
    g = groups(resolve_layout(layout_spec("dp=2,tp=2,pp=2"), 8))
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("dp, tp, pp", [(1, 1, 1), (4, 1, 1), (1, 4, 1), (2, 2, 2), (3, 2, 1), (1, 2, 3)])
def test_every_rank_is_in_exactly_one_group_per_axis(dp, tp, pp):
    g = groups(resolve_layout(LayoutSpec(dp=dp, tp=tp, pp=pp), dp * tp * pp))
    for axis, size in (("tp", tp), ("dp", dp), ("pp", pp)):
        flat = sorted(r for group in g[axis] for r in group)
        assert flat == list(range(dp * tp * pp))
        assert all(len(group) == size for group in g[axis])


def test_tp_group_spanning_hosts_is_refused():
    spec = layout_spec("tp=2")
    host_layout(spec, [HostSlots(host="a", slots=[0, 1, 2, 3]), HostSlots(host="b", slots=[0, 1, 2, 3])])
    with pytest.raises(UsageError) as info:
        host_layout(spec, [HostSlots(host="a", slots=[0, 1, 2]), HostSlots(host="b", slots=[0, 1, 2, 3, 4])])
    assert "spans hosts a, b" in info.value.message and "multiple of 2" in info.value.hint


def test_the_degrees_are_named_once_in_the_grid():
    """The fields, the keys --parallel and [parallel] take, the spelling, the groups and the mesh: one order each,
    all of them made from GRID."""
    assert sorted(DEGREES) == sorted(GRID) and DEGREES[0] == "dp"  # the spelling: dp, then the splits
    assert tuple(LayoutSpec.model_fields) == tuple(Layout.model_fields) == LAYOUT_KEYS
    assert tuple(ParallelSection.model_fields) == LAYOUT_KEYS  # the config's keys, in the same order
    assert tuple(ParallelDims.model_fields)[: len(LAYOUT_KEYS)] == LAYOUT_KEYS
    assert parse_layout(",".join(f"{key}=1" for key in DEGREES)) == dict.fromkeys(DEGREES, 1)
    layout = resolve_layout(LayoutSpec(), 1)
    assert [word.partition("=")[0] for word in str(layout).split(",")] == [*DEGREES, "zero"]
    assert tuple(groups(layout)) == GRID  # the plan's groups, the fastest axis first
    assert tuple(mesh_shape(layout)) == tuple(reversed(GRID))  # the engine's mesh dims, the slowest first
    with pytest.raises(UsageError) as info:
        layout_spec("xp=2")
    assert f"use keys {', '.join(LAYOUT_KEYS)}" in info.value.hint


def contract_with_grid(grid: str, monkeypatch) -> types.ModuleType:
    """contract/layout.py as it would be with GRID written as ``grid``, and nothing else changed."""
    source = inspect.getsource(contract)
    edited = source.replace('GRID = ("tp", "dp", "pp")', f"GRID = {grid}")
    assert edited != source
    module = types.ModuleType("layout_with_another_grid")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # where pydantic resolves the fields' types
    exec(compile(edited, "layout_with_another_grid", "exec"), module.__dict__)
    return module


def test_a_new_degree_is_its_name_in_the_grid(monkeypatch):
    """Context parallelism (cp) between tp and dp, written in GRID alone: the grammar, the spelling, the resolution
    and its messages, the groups and the mesh's shape all have it."""
    with_cp = contract_with_grid('("tp", "cp", "dp", "pp")', monkeypatch)
    layout = with_cp.resolve_layout(with_cp.layout_spec("tp=2,cp=2"), 8)
    assert str(layout) == "dp=2,tp=2,cp=2,pp=1,zero=0"
    assert layout.model_dump() == {"dp": 2, "tp": 2, "cp": 2, "pp": 1, "zero": 0}
    assert with_cp.groups(layout) == {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "pp": [[0], [1], [2], [3], [4], [5], [6], [7]],
    }
    assert with_cp.mesh_shape(layout) == {"pp": 1, "dp": 2, "cp": 2, "tp": 2}
    assert with_cp.rank_of(layout, dp=1, cp=1) == 6
    with pytest.raises(UsageError, match=r"dp\(2\)\*tp\(2\)\*cp\(2\)\*pp\(1\) = 8 != world size 4"):
        with_cp.resolve_layout(with_cp.layout_spec("dp=2,tp=2,cp=2"), 4)


@pytest.mark.parametrize("dp, tp, pp", [(1, 1, 1), (2, 2, 2), (3, 2, 1), (1, 2, 3)])
def test_a_ranks_place_in_the_grid_and_back(dp, tp, pp):
    layout = Layout(dp=dp, tp=tp, pp=pp)
    for rank in range(layout.world_size):
        place = place_of(layout, rank)
        assert rank_of(layout, **place) == rank == place["pp"] * (dp * tp) + place["dp"] * tp + place["tp"]
    assert rank_of(Layout(dp=2, tp=2, pp=2), pp=1, tp=1) == 5  # an axis left out is 0


def test_the_engine_records_a_layout_without_its_pipeline_keys():
    layout = resolve_layout(layout_spec("pp=2,zero=1,schedule=gpipe,microbatches=4"), 4)
    assert spelling(layout) == "dp=2,tp=1,pp=2,zero=1,schedule=gpipe,microbatches=4"
    assert spelling(layout, pipeline=False) == "dp=2,tp=1,pp=2,zero=1"


def test_the_config_section_is_the_contracts_layout_with_the_engines_pipeline():
    """Left out, a degree or the ZeRO stage is what the contract says; the pipeline's keys are the engine's
    own choices (1F1B, two virtual stages), and DISTLAUNCH_PARALLEL carries them only where they apply."""
    unset, section = LayoutSpec(), ParallelSection()
    assert [getattr(section, key) for key in (*DEGREES, "zero")] == [getattr(unset, key) for key in (*DEGREES, "zero")]
    assert (unset.schedule, unset.virtual_stages) == (None, None)
    assert (section.schedule, section.virtual_stages, section.microbatches) == ("1f1b", 2, None)
    assert parallel_spec(load_config(None, [])) == "dp=auto,tp=1,pp=1,zero=0"
    assert parallel_spec(load_config(None, ["parallel.pp=2"])) == "dp=auto,tp=1,pp=2,zero=0,schedule=1f1b"
    interleaved = load_config(None, ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.microbatches=4"])
    assert parallel_spec(interleaved) == "dp=auto,tp=1,pp=2,zero=0,schedule=interleaved,microbatches=4,virtual_stages=2"

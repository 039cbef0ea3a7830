import pytest

from distlaunch.contract.layout import Layout, LayoutSpec, groups, layout_spec, parse_layout, resolve_layout
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import host_layout


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

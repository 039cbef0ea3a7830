import pytest

from distlaunch.errors import UsageError
from distlaunch.launcher.parallel import ParallelSpec, check_tp_within_hosts, groups, parse_parallel, resolve_parallel


def test_parse_full_and_partial_specs():
    assert parse_parallel("dp=2,tp=2,pp=2,zero=1") == ParallelSpec(dp=2, tp=2, pp=2, zero=1)
    assert parse_parallel("tp=4") == ParallelSpec(dp=None, tp=4)
    assert parse_parallel("dp=auto, zero=3") == ParallelSpec(dp=None, zero=3)
    assert parse_parallel(None) == ParallelSpec()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("dp=2,xp=2", "unknown entry 'xp=2'"),
        ("zero=4", "zero=4 is not a ZeRO stage"),
        ("tp=0", "tp=0 must be at least 1"),
        ("tp=two", "tp='two' is not an integer"),
        ("dp=2,dp=4", "dp is given twice"),
        ("tp", "unknown entry 'tp'"),
    ],
)
def test_parse_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_parallel(text)


def test_auto_dp_fills_the_world():
    assert resolve_parallel(parse_parallel("dp=auto,tp=2,pp=2"), 16).dp == 4
    assert resolve_parallel(ParallelSpec(), 6).dp == 6


def test_product_must_equal_world_size_with_the_fix():
    with pytest.raises(UsageError) as info:
        resolve_parallel(parse_parallel("dp=2,tp=2,pp=3"), 8)
    assert "dp(2)*tp(2)*pp(3) = 12 != world size 8" in info.value.message
    with pytest.raises(UsageError, match="not divisible"):
        resolve_parallel(parse_parallel("tp=3"), 8)


def test_groups_tp_fastest_then_dp_then_pp():
    g = groups(resolve_parallel(parse_parallel("dp=2,tp=2,pp=2"), 8))
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("dp, tp, pp", [(1, 1, 1), (4, 1, 1), (1, 4, 1), (2, 2, 2), (3, 2, 1), (1, 2, 3)])
def test_every_rank_is_in_exactly_one_group_per_axis(dp, tp, pp):
    g = groups(resolve_parallel(ParallelSpec(dp=dp, tp=tp, pp=pp), dp * tp * pp))
    for axis, size in (("tp", tp), ("dp", dp), ("pp", pp)):
        flat = sorted(r for group in g[axis] for r in group)
        assert flat == list(range(dp * tp * pp))
        assert all(len(group) == size for group in g[axis])


def test_tp_group_spanning_hosts_is_refused():
    p = resolve_parallel(parse_parallel("tp=2"), 8)
    check_tp_within_hosts(p, ["a"] * 4 + ["b"] * 4)
    with pytest.raises(UsageError) as info:
        check_tp_within_hosts(p, ["a"] * 3 + ["b"] * 5)
    assert "spans hosts a, b" in info.value.message and "multiple of 2" in info.value.hint

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distlaunch.errors import UsageError
from distlaunch.launcher.hostfile import apply_filters, parse_hostfile_text, read_hostfile

ROOT = Path(__file__).resolve().parents[2]


def test_three_formats_mix_with_comments_and_blank_lines():
    hosts = parse_hostfile_text("# cluster\nnode1 slots=4\n\nnode2:2   # two GPUs\nnode3\n")
    assert [(h.host, h.nslots, h.explicit) for h in hosts] == [
        ("node1", 4, True),
        ("node2", 2, True),
        ("node3", 1, False),
    ]
    assert [h.line for h in hosts] == [2, 4, 5]


def test_openmpi_max_slots_is_accepted():
    assert parse_hostfile_text("n1 slots=2 max_slots=4")[0].nslots == 2


@pytest.mark.parametrize(
    "text, fragment, hint",
    [
        ("node1 slot=8", "unknown field 'slot=8'", "did you mean slots=8?"),
        ("node1 slots=0", "slots=0 must be at least 1", "at least one slot"),
        ("node1 slots=-2", "slots=-2 must be at least 1", "at least one slot"),
        ("node1 slots=two", "'two' is not a whole number", "positive integer"),
        ("node1:x", "'x' is not a whole number", "positive integer"),
        ("node1 slots=2\nnode1 slots=2", "already listed on line 1", "list each host once"),
        ("node1:2 slots=2", "unexpected text", "not both"),
        ("no$de slots=1", "not a valid host name", "host name"),
        ("node1 gpus=4", "unknown field 'gpus=4'", "did you mean slots=4?"),
        ("node1 4", "unknown field '4'", "did you mean slots=4?"),
    ],
)
def test_errors_name_file_line_and_fix(text, fragment, hint):
    with pytest.raises(UsageError) as info:
        parse_hostfile_text(text, "cluster.txt")
    assert "hostfile cluster.txt line" in info.value.message
    assert fragment in info.value.message
    assert hint in info.value.hint


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_hostfile_is_an_error(text):
    with pytest.raises(UsageError, match="lists no hosts"):
        parse_hostfile_text(text, "h")


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        read_hostfile(tmp_path / "nope")


@pytest.mark.parametrize("name", ["deepspeed.txt", "mpich.txt", "bare.txt", "mixed.txt"])
def test_bundled_example_hostfiles_parse(name):
    assert read_hostfile(ROOT / "hostfiles" / name)


HOSTS = "node1 slots=4\nnode2 slots=4\nnode3 slots=2\n"


def test_include_hosts_and_slots():
    hosts = apply_filters(parse_hostfile_text(HOSTS), include="node1:0,1@node3")
    assert [(h.host, h.slots) for h in hosts] == [("node1", [0, 1]), ("node3", [0, 1])]


def test_exclude_hosts_and_slots():
    hosts = apply_filters(parse_hostfile_text(HOSTS), exclude="node2@node1:3")
    assert [(h.host, h.slots) for h in hosts] == [("node1", [0, 1, 2]), ("node3", [0, 1])]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"include": "node9"}, "host 'node9' is not in the hostfile"),
        ({"include": "node1:7"}, "has no slot 7"),
        ({"exclude": "node1@node2@node3"}, "removes every host"),
        ({"include": "node1:a"}, "are not integers"),
        ({"include": "node1@@node2"}, "empty entry"),
        ({"include": "node1", "exclude": "node2"}, "both given"),
    ],
)
def test_filter_errors(kwargs, fragment):
    with pytest.raises(UsageError, match=fragment):
        apply_filters(parse_hostfile_text(HOSTS), **kwargs)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_arbitrary_text_gives_hosts_or_our_error(text):
    try:
        hosts = parse_hostfile_text(text, "fuzz")
    except UsageError as exc:
        assert exc.message.startswith("hostfile fuzz")
    else:
        assert hosts and all(h.nslots >= 1 for h in hosts)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9\-]{0,8}", fullmatch=True),
            st.integers(1, 64),
            st.sampled_from(["{h} slots={n}", "{h}:{n}"]),
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[0],
    )
)
def test_generated_hostfiles_round_trip(entries):
    text = "\n".join(fmt.format(h=h, n=n) for h, n, fmt in entries)
    assert [(h.host, h.nslots) for h in parse_hostfile_text(text)] == [(h, n) for h, n, _ in entries]

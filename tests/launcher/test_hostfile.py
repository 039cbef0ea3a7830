import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import apply_filters, parse_hostfile_text, read_hostfile
from distlaunch.launcher.planning.spec import is_local_host
from tests.helpers import invoke

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
        ("node1 slots=2 slots=3", "slots is given twice ('slots=2', then 'slots=3')", "give slots once"),
        ("node1 slots=2 max_slots=4 max-slots=8", "max_slots is given twice", "give max_slots once"),
        (
            "node1 slots=2\nNODE1 slots=2",
            "host 'NODE1' is already listed on line 1 as 'node1' (the same host: host names ignore case)",
            "list each host once",
        ),
        ("::1 slots=2\n0:0::1", "host '0:0::1' is already listed on line 1 as '::1' (the same address)", "once"),
        ("[node1]:2", "'[node1]:2' is not a valid host name", "[fe80::1]:8"),
        ("[::1]:2 slots=2", "unexpected text", "not both"),
        ("fe80::1%eth0! slots=2", "not a valid host name", "host name"),
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
    with pytest.raises(UsageError, match="does not exist") as err:
        read_hostfile(tmp_path / "nope")
    assert "-H" in str(err.value) and ":1" not in str(err.value)


def test_a_bare_host_name_for_a_hostfile_is_told_how_to_list_hosts_in_place(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(["run", "-H", "localhost", "-n", "1", "train.py"])  # Horovod's form: one slot on localhost
    assert r.exit_code == 2
    assert "hostfile 'localhost' does not exist" in r.stderr and "-H localhost:1" in r.stderr, r.stderr


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "hostfiles").glob("*.txt")))
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


def test_a_leading_byte_order_mark_is_not_part_of_the_first_host(tmp_path):
    path = tmp_path / "hosts"
    path.write_bytes(b"\xef\xbb\xbfnode1 slots=2\nnode2 slots=2\n")  # as Notepad saves "UTF-8 with BOM"
    assert [(h.host, h.nslots) for h in read_hostfile(path)] == [("node1", 2), ("node2", 2)]


def test_host_names_longer_than_dns_allows_are_refused():
    label63 = "a" * 63
    longest = ".".join([label63, label63, label63, "b" * 61])  # 253 characters, the most DNS allows
    assert parse_hostfile_text(f"{longest} slots=1\n{longest}. slots=1\n{label63}:1", "h")[0].host == longest
    for text, fragment in [
        (f"{longest}c slots=1", "has 254 characters, more than a DNS name's 253"),
        (f"node1.{'x' * 64}.example.com:2", "has 64 characters, more than a DNS label's 63"),
    ]:
        with pytest.raises(UsageError) as info:
            parse_hostfile_text(text, "h")
        assert info.value.message.startswith("hostfile h line 1") and fragment in info.value.message
        assert "253 characters and 63 between dots" in info.value.hint


def test_an_inline_host_name_too_long_for_a_path_gets_the_hostfiles_refusal():
    """-H NAME:1 with a 254-character NAME: before, trying it as a file path first ended in an internal error
    (ENAMETOOLONG); now the same one line as in a hostfile, exit 2."""
    r = invoke(["run", "-H", f"{'n' * 254}:1", "--dry-run", "train.py"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "internal error" not in r.stderr, r.stderr
    assert "has 254 characters, more than a DNS name's 253" in lines[0]


@pytest.mark.parametrize(
    "text, host, nslots, explicit",
    [
        ("::1 slots=2", "::1", 2, True),
        ("fe80::1 slots=4", "fe80::1", 4, True),
        ("fe80::1%eth0 slots=2 max_slots=2", "fe80::1%eth0", 2, True),
        ("[::1]:2", "::1", 2, True),
        ("[fe80::1] slots=3", "fe80::1", 3, True),
        ("[fe80::1]", "fe80::1", 1, False),
        ("::1", "::1", 1, False),
        ("::1:2", "::1:2", 1, False),  # itself an address: a bare IPv6 address never carries a count
    ],
)
def test_ip_addresses_bare_or_bracketed_keep_the_plain_address(text, host, nslots, explicit):
    [entry] = parse_hostfile_text(text)
    assert (entry.host, entry.nslots, entry.explicit) == (host, nslots, explicit)


@pytest.mark.parametrize(
    "kwargs, kept",
    [
        ({"include": "node1:0@node1:1"}, [("node1", [0, 1])]),
        ({"include": "node1@node1:0"}, [("node1", [0, 1, 2, 3])]),  # a bare name is all of its slots
        ({"include": "node3:1@node1:2,3@node3:0"}, [("node1", [2, 3]), ("node3", [0, 1])]),
        ({"exclude": "node2:0@node2:1@node2:2,3@node3"}, [("node1", [0, 1, 2, 3])]),
        ({"exclude": "node2@node2:1@node3"}, [("node1", [0, 1, 2, 3])]),
        ({"include": "NODE1:0@Node3"}, [("node1", [0]), ("node3", [0, 1])]),  # host names ignore case
    ],
)
def test_filter_entries_naming_one_host_merge(kwargs, kept):
    hosts = apply_filters(parse_hostfile_text(HOSTS), **kwargs)
    assert [(h.host, h.slots) for h in hosts] == kept


@pytest.mark.parametrize("kwargs", [{"include": ""}, {"include": "  "}, {"exclude": ""}])
def test_an_empty_filter_is_an_error_not_every_host(kwargs):
    with pytest.raises(UsageError) as info:
        apply_filters(parse_hostfile_text(HOSTS), **kwargs)
    assert "names no hosts" in info.value.message and "node1:0,1@node2" in info.value.hint


V6_HOSTS = "fe80::1 slots=2\n[fe80::2]:2\nnode3 slots=2\n"


@pytest.mark.parametrize(
    "kwargs, kept",
    [
        ({"include": "[fe80::1]:1@fe80::2"}, [("fe80::1", [1]), ("fe80::2", [0, 1])]),
        ({"exclude": "[FE80::2]@[fe80::1]:0"}, [("fe80::1", [1]), ("node3", [0, 1])]),
    ],
)
def test_filters_name_ipv6_hosts_bare_or_with_slots_in_brackets(kwargs, kept):
    hosts = apply_filters(parse_hostfile_text(V6_HOSTS), **kwargs)
    assert [(h.host, h.slots) for h in hosts] == kept


def test_a_colon_count_after_a_bare_ipv6_filter_entry_is_not_guessed():
    with pytest.raises(UsageError) as info:
        apply_filters(parse_hostfile_text(V6_HOSTS), include="fe80::1:0")
    assert "host 'fe80::1:0' is not in the hostfile" in info.value.message
    assert "[fe80::1]:0" in info.value.hint


# The CLI as users hit these: hostfile hf of two 2-slot remote hosts, ssh_config off so nothing is looked up.
def _dry_run(tmp_path, text: str, *args: str):
    hostfile = tmp_path / "hf"
    hostfile.write_text(text, encoding="utf-8")
    return invoke(["run", "-H", str(hostfile), *args, "--ssh-config", os.devnull, "--dry-run", "--json", "x.py"])


@pytest.mark.parametrize(
    "args, world_size", [(["-e", "node2:0@node2:1"], 2), (["-i", "node1:0@node1:1"], 2), (["-i", "node1@NODE2:1"], 3)]
)
def test_cli_filters_for_one_host_merge(tmp_path, args, world_size):
    r = _dry_run(tmp_path, "node1 slots=2\nnode2 slots=2\n", *args)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["world_size"] == world_size


@pytest.mark.parametrize(
    "text, args, fragment",
    [
        ("node1 slots=2\n", ["-i", ""], "error: --include '' names no hosts (hint: name hosts separated by '@'"),
        ("node1 slots=2\n", ["-e", ""], "error: --exclude '' names no hosts"),
        ("node1 slots=2 slots=3\n", [], "line 1 'node1 slots=2 slots=3': slots is given twice"),
        ("node1 slots=2\nNODE1 slots=2\n", [], "line 2 'NODE1 slots=2': host 'NODE1' is already listed on line 1"),
        (f"{'n' * 254} slots=1\n", [], "more than a DNS name's 253"),
    ],
)
def test_cli_hostfile_and_filter_mistakes_are_one_line_and_exit_2(tmp_path, text, args, fragment):
    r = _dry_run(tmp_path, text, *args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr


def test_cli_an_empty_filter_without_a_hostfile_is_not_ignored():
    r = invoke(["run", "-n", "1", "-i", "", "--dry-run", "x.py"])
    assert r.exit_code == 2 and "--include/--exclude need a hostfile" in r.stderr


def test_cli_reads_a_hostfile_saved_with_a_byte_order_mark(tmp_path):
    r = _dry_run(tmp_path, "\ufeffnode1 slots=2\nnode2 slots=2\n")  # written as UTF-8: the BOM is 3 bytes
    assert r.exit_code == 0, r.stderr
    assert [n["host"] for n in json.loads(r.stdout)["nodes"]] == ["node1", "node2"]


def test_cli_ipv6_hosts_carry_the_plain_address(tmp_path):
    r = _dry_run(tmp_path, "fe80::1 slots=2\n[fe80::2]:2\n")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [(n["host"], n["address"]) for n in plan["nodes"]] == [("fe80::1", "fe80::1"), ("fe80::2", "fe80::2")]
    assert plan["master_addr"] == "fe80::1"
    assert {r["env"]["MASTER_ADDR"] for n in plan["nodes"] for r in n["ranks"]} == {"fe80::1"}
    shown = invoke(["run", "-H", str(tmp_path / "hf"), "--ssh-config", os.devnull, "--dry-run", "x.py"]).stdout
    assert re.search(r"master \[fe80::1\]:\d+(,|\n)", shown)  # its own colons would hide where the port starts


def test_cli_ipv6_loopback_is_this_machine(tmp_path):
    script = str(ROOT / "tests" / "launcher" / "scripts" / "env_dump.py")
    hostfile = tmp_path / "hf"
    hostfile.write_text("[::1]:2\n", encoding="utf-8")
    r = invoke(["run", "-H", str(hostfile), "--dry-run", "--json", script])
    assert r.exit_code == 0, r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert (node["host"], node["local"], len(node["ranks"])) == ("::1", True, 2)


@pytest.mark.parametrize("text", ["LOCALHOST\n", "Localhost:2\n", "localHost slots=2\n"])
def test_cli_this_machines_names_ignore_case(tmp_path, text):
    """As the duplicate check and the filters compare names: LOCALHOST is localhost, so it runs here, not over
    SSH to a host 'LOCALHOST' (whose master would get a port from the remote range)."""
    assert is_local_host(text.split()[0].split(":")[0])
    script = str(ROOT / "tests" / "launcher" / "scripts" / "env_dump.py")
    hostfile = tmp_path / "hf"
    hostfile.write_text(text, encoding="utf-8")
    r = invoke(["run", "-H", str(hostfile), "--ssh-config", os.devnull, "--dry-run", "--json", script])
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    [node] = plan["nodes"]
    assert node["local"] is True and plan["master_addr"] == "127.0.0.1", plan

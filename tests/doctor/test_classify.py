"""Pure parts of the doctor: facts in, findings out (no hosts, no network)."""

from __future__ import annotations

import threading

import pytest

from distlaunch.doctor.bench import parse_size
from distlaunch.doctor.checks_cluster import (
    clock_checks,
    duplicate_checks,
    master_port_check,
    parallel_check,
    parallel_spec_error,
    ssh_checks,
)
from distlaunch.doctor.checks_host import gpus_check, memlock_check, nccl_check, shm_check, torch_check
from distlaunch.doctor.checks_network import (
    ifname_suggestion,
    loopback_hostname_check,
    nccl_selects,
    nic_check,
    reachable_check,
)
from distlaunch.doctor.gather import HostResult, ListenerResult
from distlaunch.doctor.model import DoctorReport, HostFacts, check
from distlaunch.doctor.sessions import StartGate
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.listener_script import decode_address
from distlaunch.remote.ssh import SshError
from distlaunch.remote.sshconfig import SshTarget


def inventory(gpus: int = 8, ib: tuple[str, ...] = ()) -> dict:
    """A host's inventory as the probe sends it: ``gpus`` H100s, lo, eth0 and ib0, the InfiniBand devices ``ib``."""
    return {
        "gpus": [{"index": i, "model": "NVIDIA H100", "memory_mib": 81559} for i in range(gpus)],
        "gpu_source": "nvidia-smi" if gpus else None,
        "interfaces": [
            {"name": "lo", "up": True, "addresses": ["127.0.0.1/8"]},
            {"name": "eth0", "up": True, "addresses": ["10.0.0.5/24"]},
            {"name": "ib0", "up": True, "addresses": ["192.168.1.5/24"]},
        ],
        "ib_devices": [{"name": name, "ports": []} for name in ib],
    }


def facts(**over) -> HostFacts:
    base = dict(
        hostname="gpu1",
        fqdn="gpu1.lab",
        hostname_addrs=["10.0.0.5"],
        fqdn_addrs=["10.0.0.5"],
        machine_id="m1",
        boot_id="b1",
        python={"executable": "/usr/bin/python3", "version": "3.11.7"},
        distlaunch="0.1.0",
        torch={"version": "2.5.1+cu124", "cuda": "12.4", "nccl": "2.21.5", "path": "/x"},
        inventory=inventory(),
        shm_bytes=64 << 30,
        memlock=-1,
        time=1000.0,
        sent_at=1000.0,
        received_at=1000.1,
        master={
            "resolved": ["10.0.0.1"],
            "address": "10.0.0.1",
            "route": {"dev": "eth0", "src": "10.0.0.5"},
            "connect": {"result": "ok", "token": "n0nce", "seconds": 0.001},
        },
    )
    base.update(over)
    return HostFacts.model_validate(base)


def result(host: str, f: HostFacts | None, hostname: str = "10.0.0.5") -> HostResult:
    target = SshTarget(alias=host, hostname=hostname, user="u")
    return HostResult(host=host, slots=HostSlots(host=host, slots=list(range(8))), target=target, facts=f)


def listener(**over) -> ListenerResult:
    base = dict(
        host="gpu0",
        address="10.0.0.1",
        port=29500,
        nonce="n0nce",
        started=True,
        bound=True,
        status={"bound": True, "holders": []},
    )
    base.update(over)
    return ListenerResult(**base)


def test_hint_links_to_the_troubleshooting_section():
    assert check("ssh.auth", "h", "fail", "x", "do y").hint == "do y; see docs/troubleshooting.md#sshauth"
    assert check("dns", "h", "pass", "x").hint == ""


def test_report_ok_follows_failures_not_warnings():
    assert DoctorReport.of([check("shm", "h", "warn", "small", "grow it")]).ok is True
    assert DoctorReport.of([check("shm", "h", "fail", "gone", "mount it")]).ok is False
    assert set(DoctorReport.of([]).model_dump()) == {
        "ok",
        "checks",
    }  # the documented shape without --bench (docs/cli.md)


@pytest.mark.parametrize(
    "value, name, selected",
    [
        ("eth", "eth0", True),
        ("eth", "ib0", False),
        ("=eth0", "eth0", True),
        ("=eth", "eth0", False),
        ("^docker,lo", "eth0", True),
        ("^docker,lo", "lo", False),
        ("ib,eth", "eth1", True),
    ],
)
def test_nccl_socket_ifname_semantics(value, name, selected):
    assert nccl_selects(value, name) is selected


def test_nic_suggests_the_interface_toward_the_master():
    c = nic_check("gpu1", facts(), {}, single_machine=False)
    assert c.status == "pass" and "via eth0" in c.detail and "NCCL_SOCKET_IFNAME=eth0" in c.detail


def test_nic_user_value_matching_nothing_fails_and_leaving_out_the_route_warns():
    assert nic_check("gpu1", facts(), {"NCCL_SOCKET_IFNAME": "enp"}, False, "nccl").status == "fail"
    assert nic_check("gpu1", facts(), {"GLOO_SOCKET_IFNAME": "eth0,bond0"}, False, "gloo").status == "fail"
    assert nic_check("gpu1", facts(), {"NCCL_SOCKET_IFNAME": "ib"}, False, "nccl").status == "warn"
    assert (
        nic_check("gpu1", facts(), {"NCCL_SOCKET_IFNAME": "^lo", "GLOO_SOCKET_IFNAME": "eth0"}, False).status == "pass"
    )


def test_nic_variable_of_the_other_backend_only_warns():
    gloo_job = nic_check("gpu1", facts(), {"NCCL_SOCKET_IFNAME": "enp"}, False, "gloo")
    assert gloo_job.status == "warn" and "harmless for this gloo job" in gloo_job.detail
    nccl_job = nic_check("gpu1", facts(), {"GLOO_SOCKET_IFNAME": "bond0"}, False, "nccl")
    assert nccl_job.status == "warn"


def test_nic_reports_every_problem_and_one_value_for_all_hosts():
    c = nic_check(
        "gpu1", facts(), {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"}, False, "gloo", "eth0,ens5"
    )
    assert c.status == "fail"
    assert "NCCL_SOCKET_IFNAME=ens5" in c.detail and "GLOO_SOCKET_IFNAME=ens5" in c.detail
    assert "NCCL_SOCKET_IFNAME=eth0,ens5" in c.hint and "GLOO_SOCKET_IFNAME" in c.hint
    assert ifname_suggestion(["eth0", "ens5", "eth0", None]) == "eth0,ens5"


def test_loopback_hostname_fails_a_gloo_job_and_warns_an_nccl_one():
    f = facts(hostname_addrs=["127.0.1.1"], fqdn_addrs=["127.0.1.1"])
    c = loopback_hostname_check("gpu1", f, single_machine=False, ifnames_set=False)
    assert c.status == "fail" and "127.0.1.1" in c.detail and "map gpu1 to 10.0.0.5" in c.hint
    nccl = loopback_hostname_check("gpu1", f, single_machine=False, ifnames_set=False, backend="nccl")
    assert nccl.status == "warn" and "NCCL picks" in nccl.detail
    assert loopback_hostname_check("gpu1", f, False, False, "gloo", gloo_set=True).status == "warn"
    assert loopback_hostname_check("gpu1", f, single_machine=True, ifnames_set=False).status == "pass"
    assert loopback_hostname_check("gpu1", f, single_machine=False, ifnames_set=True).status == "warn"
    assert loopback_hostname_check("gpu1", facts(), False, False).status == "pass"


def test_loopback_hostname_only_warns_where_the_launch_names_the_hosts_card():
    """The launch's own rule (planning/netcards.py) names the card toward the master: gloo binds that, not the
    hostname's address, and the job runs; another launcher's would not."""
    f = facts(hostname_addrs=["127.0.1.1"], fqdn_addrs=["127.0.1.1"])
    c = loopback_hostname_check("gpu1", f, single_machine=False, ifnames_set=False, named="eth0")
    assert c.status == "warn" and "distlaunch sets GLOO_SOCKET_IFNAME=eth0 on gpu1" in c.detail
    assert "map gpu1 to 10.0.0.5" in c.hint  # the fix, for the other launchers
    nccl = loopback_hostname_check("gpu1", f, False, False, "nccl", named="eth0")
    assert nccl.status == "warn" and "without the GLOO_SOCKET_IFNAME=eth0 distlaunch sets" in nccl.detail


def test_torch_mismatch_with_master_fails():
    master = facts()
    assert torch_check("gpu1", facts(), master, is_master=False).status == "pass"
    other = facts(torch={"version": "2.4.0+cu121", "cuda": "12.1", "nccl": "2.20.5", "path": "/x"})
    c = torch_check("gpu1", other, master, is_master=False)
    assert c.status == "fail" and "2.4.0+cu121" in c.detail and "torch==2.5.1+cu124" in c.hint
    assert torch_check("gpu1", facts(torch=None), master, False).status == "fail"


def test_nccl_needs_a_cuda_build_where_gpus_exist():
    assert nccl_check("gpu1", facts(), facts()).status == "pass"
    cpu_torch = facts(torch={"version": "2.5.1+cpu", "cuda": None, "nccl": None, "path": "/x"})
    assert nccl_check("gpu1", cpu_torch, facts()).status == "fail"
    assert nccl_check("cpu1", facts(inventory=inventory(gpus=0)), facts()).status == "skip"
    older = facts(torch={"version": "2.5.1+cu124", "cuda": "12.4", "nccl": "2.20.0", "path": "/x"})
    assert nccl_check("gpu1", older, facts()).status == "fail"


def test_gpus_against_slots():
    assert gpus_check("gpu1", facts(), slots=8, explicit_slots=True, any_gpus=True).status == "pass"
    c = gpus_check("gpu1", facts(), slots=16, explicit_slots=True, any_gpus=True)
    assert c.status == "fail" and "slots=8" in c.hint
    none = facts(inventory=inventory(gpus=0))
    assert gpus_check("cpu1", none, 2, True, any_gpus=False).status == "pass"
    assert gpus_check("cpu1", none, 2, True, any_gpus=True).status == "fail"


def test_shm_and_memlock():
    assert shm_check("h", facts(shm_bytes=64 << 20)).status == "warn"
    assert shm_check("h", facts(shm_bytes=None)).status == "warn"
    assert shm_check("h", facts()).status == "pass"
    assert memlock_check("h", facts(inventory=inventory(ib=("mlx5_0",)), memlock=64 << 10)).status == "warn"
    assert memlock_check("h", facts(inventory=inventory(ib=("mlx5_0",)), memlock=-1)).status == "pass"
    assert memlock_check("h", facts(memlock=64 << 10)).status == "pass"


def test_reachability_kinds_are_told_apart():
    ok = reachable_check("h", facts(), listener())
    assert ok.status == "pass"
    for kind, words in (("refused", "refused"), ("timeout", "drops"), ("error", "No route")):
        connect = {"result": kind, "seconds": 2.5, "error": "No route to host"}
        c = reachable_check("h", facts(master={**facts().master, "connect": connect}), listener())
        assert c.status == "fail" and words in c.detail
    stranger = facts(master={**facts().master, "connect": {"result": "ok", "token": "other", "seconds": 0.001}})
    assert "not the doctor's listener" in reachable_check("h", stranger, listener()).detail
    assert reachable_check("h", facts(), listener(bound=False)).status == "skip"


def test_master_port_reasons():
    held = listener(
        bound=False,
        status={
            "bound": False,
            "reason": "in-use",
            "holders": [{"address": "0.0.0.0", "pid": 4242, "command": "python train.py"}],
        },
    )
    c = master_port_check(held)
    assert c.status == "fail" and "pid 4242 (python train.py)" in c.detail and "kill 4242" in c.hint
    foreign = listener(
        bound=False, status={"bound": False, "reason": "not-local", "address": "10.0.0.9", "holders": []}
    )
    assert "is not an address of gpu0" in master_port_check(foreign).detail
    assert master_port_check(listener()).status == "pass"
    assert master_port_check(listener(started=False, error="master host gpu0 could not be reached")).status == "skip"


def test_an_ipv6_address_and_its_port_are_written_in_brackets():
    v6 = listener(address="fd00::1")
    assert "[fd00::1]:29500 is free on gpu0" in master_port_check(v6).detail
    assert (
        "no listener on [fd00::1]:29500"
        in reachable_check("h", facts(), listener(address="fd00::1", bound=False)).detail
    )
    assert SshTarget(alias="n", hostname="fd00::2", user="u", port=2222).endpoint == "[fd00::2]:2222"
    assert SshTarget(alias="n", hostname="node2", user="u", port=22).endpoint == "node2:22"


def test_ssh_checks_pass_before_the_failed_step_and_skip_after():
    r = result("gpu1", None)
    r.ssh_error = SshError("gpu1", "hostkey-unknown", "host key unknown", "ssh-keyscan …")
    by_id = {c.id: c.status for c in ssh_checks(r)}
    assert by_id == {"ssh.connect": "pass", "ssh.hostkey": "fail", "ssh.auth": "skip"}
    r.ssh_error = SshError("gpu1", "dns", "cannot resolve", "fix DNS")
    assert [c.status for c in ssh_checks(r)] == ["fail", "skip", "skip", "skip"]


def test_duplicate_host_real_vs_simulated():
    a, b = result("gpu1", facts()), result("gpu1-alias", facts(), hostname="10.0.0.6")
    found = {c.host: c.status for c in duplicate_checks([a, b])}
    assert found == {"gpu1": "pass", "gpu1-alias": "fail"}
    sim = [result("node1", facts(), "127.0.0.11"), result("node2", facts(), "127.0.0.12")]
    assert {c.status for c in duplicate_checks(sim)} == {"pass"}
    other = result("gpu2", facts(machine_id="m2", hostname="gpu2"))
    assert {c.status for c in duplicate_checks([a, other])} == {"pass"}


def test_clock_skew_over_a_second_warns():
    ref = result("gpu0", facts())
    late = result("gpu1", facts(time=1002.6, sent_at=1000.0, received_at=1000.1))
    near = result("gpu2", facts(time=1000.3, sent_at=1000.0, received_at=1000.1))
    by_host = {c.host: c.status for c in clock_checks([ref, late, near])}
    assert by_host == {"gpu0": "pass", "gpu1": "warn", "gpu2": "pass"}


def test_parallel_fits_the_hostfile():
    hosts = [HostSlots(host="a", slots=[0, 1, 2, 3]), HostSlots(host="b", slots=[0, 1, 2, 3])]
    assert parallel_check("dp=2,tp=4", hosts).status == "pass"
    assert parallel_check("dp=3,tp=2", hosts).status == "fail"
    bad_tp = parallel_check("tp=8", hosts)
    assert bad_tp.status == "fail" and "spans hosts" in bad_tp.detail


def test_sizes_and_addresses():
    assert parse_size("256M") == 256 << 20 and parse_size("16MiB") == 16 << 20 and parse_size("4096") == 4096
    with pytest.raises(UsageError):
        parse_size("lots")
    assert decode_address("0B00007F") == "127.0.0.11"
    assert decode_address("00000000000000000000000001000000") == "::1"


def test_bus_bandwidth_factor_and_sizes_as_nccl_tests():
    from distlaunch.doctor.allreduce_bench import bus_factor, sizes  # imports torch: only here

    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75
    assert sizes(1 << 10, 256 << 20)[0] == 1024 and sizes(1 << 10, 256 << 20)[-1] == 256 << 20
    assert len(sizes(1 << 10, 256 << 20)) == 19


def test_checks_that_need_the_master_skip_where_it_does_not_resolve():
    unresolved = {"resolved": None, "error": "[Errno -2] Name or service not known"}
    loop = facts(hostname_addrs=["127.0.1.1"], fqdn_addrs=["127.0.1.1"], master=unresolved)
    c = loopback_hostname_check("gpu1", loop, single_machine=False, ifnames_set=False)
    assert c.status == "skip" and "127.0.1.1" in c.detail and "MASTER_ADDR does not resolve on gpu1" in c.detail
    assert loopback_hostname_check("gpu1", loop, single_machine=True, ifnames_set=False).status == "pass"
    nic = nic_check("gpu1", facts(master=unresolved), {}, single_machine=False)
    assert nic.status == "skip" and "see dns" in nic.detail
    # a route that is really missing toward a master that resolves still warns
    no_route = facts(master={"resolved": ["10.0.0.1"], "address": "10.0.0.1", "route": {"error": "unreachable"}})
    assert nic_check("gpu1", no_route, {}, single_machine=False).status == "warn"
    # a user's interface name that exists nowhere fails whatever the master
    bad = nic_check("gpu1", facts(master=unresolved), {"GLOO_SOCKET_IFNAME": "ib9"}, single_machine=False)
    assert bad.status == "fail"


def test_master_port_names_each_holder_once_and_the_free_port_the_master_found():
    holders = [
        {"address": a, "pid": 3506, "command": "python\ntrain.py"} for a in ("127.0.0.1", "10.0.0.1", "10.0.0.1")
    ] + [{"address": "::", "pid": None, "command": None}]
    c = master_port_check(
        listener(
            bound=False, port=2201, status={"bound": False, "reason": "in-use", "holders": holders, "suggest": 2203}
        )
    )
    assert c.detail.count("pid 3506") == 1 and "listens on 127.0.0.1, 10.0.0.1;" in c.detail, c.detail
    assert "(python train.py)" in c.detail and "another user listens on ::" in c.detail
    assert "kill 3506)" in c.hint and "--master-port 2203 " in c.hint and "2202" not in c.hint
    top = master_port_check(
        listener(bound=False, port=65535, status={"bound": False, "reason": "error", "holders": []})
    )
    assert "65536" not in top.hint and "--master-port" in top.hint  # no free port found: none is made up


def test_a_parallel_spec_that_does_not_parse_is_an_input_error():
    assert parallel_spec_error("dp=2,tp=2") is None and parallel_spec_error(None) is None
    for spec in ("foo=1", "tp=0", "zero=9", "dp=2,dp=3"):
        found = parallel_spec_error(spec)
        assert found is not None and found.status == "fail" and found.id == "parallel"
    hosts = [HostSlots(host="a", slots=[0, 1])]
    assert parallel_spec_error("tp=4") is None and parallel_check("tp=4", hosts).status == "fail"  # parses, no fit


def test_start_gate_refuses_new_starts_and_waits_for_those_under_way():
    gate = StartGate()
    entered, release = threading.Event(), threading.Event()

    def slow_start():
        with gate.starting("h"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=slow_start)
    t.start()
    assert entered.wait(5)
    assert gate.close(0.1) is False  # one start is still under way
    with pytest.raises(SshError, match="stopping"), gate.starting("h"):
        pass
    release.set()
    assert gate.close(5) is True
    t.join(5)

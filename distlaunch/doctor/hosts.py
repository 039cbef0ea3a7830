"""``host_inventories``: every host of the hostfile (or this machine) asked what it has, over the doctor's
sessions and probe: the one library call behind ``distlaunch hosts``."""

from __future__ import annotations

from pydantic import BaseModel

from distlaunch import interrupts
from distlaunch.contract.inventory import HostInventory
from distlaunch.doctor.checks_cluster import ssh_checks
from distlaunch.doctor.gather import Gathering, HostResult
from distlaunch.doctor.model import Check, DoctorOptions
from distlaunch.doctor.runner import host_checks, load_hosts


class HostAnswer(BaseModel):
    """One host: its inventory, or why there is none (the doctor's failed check: its id, detail and hint)."""

    host: str
    inventory: HostInventory | None = None
    check: str | None = None  # ssh.connect, ssh.auth, python, ...: what failed
    error: str | None = None
    hint: str = ""


class HostsReport(BaseModel):
    """What ``distlaunch hosts`` prints: a host per line of the hostfile, in its order; ``ok`` when every host
    answered."""

    ok: bool
    hosts: list[HostAnswer]


def why_not(result: HostResult, python: str) -> Check | None:
    """The doctor's finding that says why ``result`` has no inventory: the failed SSH step, or the probe's."""
    found = ssh_checks(result) + host_checks(result, {"python": python})
    return next((c for c in found if c.status == "fail"), None)


def answer(result: HostResult, python: str) -> HostAnswer:
    """The host's inventory, or the one line of why not."""
    if result.facts is not None:
        return HostAnswer(host=result.host, inventory=result.facts.inventory)
    failed = why_not(result, python)
    if failed is None:  # no facts and no finding: say what the gathering knows
        return HostAnswer(host=result.host, check="python", error=result.probe_error or "the probe did not answer")
    return HostAnswer(host=result.host, check=failed.id, error=failed.detail, hint=failed.hint)


def host_inventories(opts: DoctorOptions) -> HostsReport:
    """Ask every host of ``opts`` (its hostfile, or this machine) for its inventory, all in parallel; a host that
    cannot be reached is an answer too, never an exception. A bad hostfile raises UsageError."""
    results = load_hosts(opts)
    results, _ = Gathering(results, opts, master_addr=None).run()
    interrupts.check()  # a signal the gathering's threads or SSH clients swallowed ends the command here
    answers = [answer(r, opts.remote_python) for r in results]
    return HostsReport(ok=all(a.inventory is not None for a in answers), hosts=answers)

"""``distlaunch doctor``: check every host before the job spends GPU hours, and say what to fix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from distlaunch.cli import groups as g
from distlaunch.cli.options import StartTimeout
from distlaunch.cli.render import print_json
from distlaunch.contract.options import SharedOptions
from distlaunch.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from distlaunch.doctor import DoctorOptions

Bench = Annotated[
    bool,
    typer.Option("--bench", help="Also measure all-reduce bandwidth across the hosts (gloo on CPU, NCCL on GPUs)."),
]
BenchMax = Annotated[
    str | None,
    typer.Option(
        "--bench-max", metavar="SIZE", help="Largest all-reduce message, e.g. 256M (default: 256M on GPUs, 16M on CPU)."
    ),
]


# how to reach the hosts, as every command that does; what run would use there (the ranks per host, the layout,
# the master, the environment, the ranks' interpreter and folder); the doctor's own
DOCTOR_OPTIONS = (
    *g.HOST_OPTIONS,
    *g.pick(g.LAUNCH_OPTIONS, *SharedOptions.model_fields, "python", "workdir"),
    g.Opt("start_timeout", StartTimeout, 20.0),
    g.Opt("bench", Bench, False),
    g.Opt("bench_max", BenchMax, None),
)


def doctor_options(values: dict[str, Any], ctx: typer.Context) -> DoctorOptions:
    """What to check, as typed (--remote-python unset or empty: the launcher's own), built here only."""
    from distlaunch.doctor import DoctorOptions, parse_size  # SSH stack: only when used

    given = {
        **values,
        "remote_python": values["remote_python"] or None,
        "bench_max_bytes": parse_size(values["bench_max"]),
    }
    return DoctorOptions(**g.fields_of(DoctorOptions, given))


@g.with_options(DOCTOR_OPTIONS, build=doctor_options, into="opts")
def doctor(
    opts: DoctorOptions,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> int:
    """Check DNS, SSH, Python/torch/NCCL versions, GPUs, the master's port and reachability, interfaces, /dev/shm and clocks on every host; print what to fix.

    --master-addr, --master-port and --backend resolve exactly as for distlaunch run; the ranks' --python and
    --workdir (default: the launcher's own) are checked on every host.

    Exit code: 0 when no check failed (warnings allowed), 1 when at least one did, 2 when the hostfile or an option
    is wrong.
    """
    from distlaunch.cli.doctor_render import render_report
    from distlaunch.doctor import run_doctor  # SSH stack: only when used

    report = run_doctor(opts)
    wrong = next((c for c in report.checks if c.status == "fail"), None) if report.usage_error else None
    if wrong is not None and not json_output:  # wrong input, no host checked: one line, as every usage error
        raise UsageError(wrong.detail, wrong.hint)
    print_json(report) if json_output else render_report(report, Console())
    if report.usage_error:
        return ExitCode.USAGE
    return ExitCode.OK if report.ok else ExitCode.CHECK_FAILED

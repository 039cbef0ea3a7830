"""``distlaunch doctor``: find why a cluster cannot train before it starts, with the fix for each finding.

    report = run_doctor(DoctorOptions(hostfile=Path("hosts"), master_port="29500"))
    report.ok, [c for c in report.checks if c.status == "fail"]

No torch here: hosts are probed by a stdlib script over SSH (``probe_script.py``); only ``--bench``
starts ranks, and those import torch in their own processes (``allreduce_bench.py``).
"""

from distlaunch.doctor.bench import parse_size
from distlaunch.doctor.model import Check, DoctorOptions, DoctorReport
from distlaunch.doctor.runner import run_doctor

__all__ = ["Check", "DoctorOptions", "DoctorReport", "parse_size", "run_doctor"]

"""Launcher memory and output throughput against the rate ranks write, measured in one invocation.

    python bench/output_flood.py [--nproc 2] [--seconds 5] [--rates 1,8,32,0]

Each rank writes 200-byte lines at a set rate (0 = as fast as it can) for a few seconds under
``distlaunch run``, twice: once with a reader that takes everything, once with a stdout nobody reads
(a stalled terminal). For each it prints the launcher's peak RSS (VmHWM from /proc) as a ratio to an
idle job's peak measured in the same run, and the lines delivered per line written. Goal: the peak
stays near the idle one (launcher <= 100 MiB) whatever the rate; a stalled reader costs dropped lines,
counted in a notice, never memory or supervision.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WRITER = Path(__file__).parent / "scripts" / "writer.py"


def peak_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def one(nproc: int, rate: float, seconds: float, read: bool) -> dict:
    env = {**os.environ, "RATE_MIB": str(rate), "SECONDS_": str(seconds), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "distlaunch", "run", "-n", str(nproc), str(WRITER)]
    counted = {"lines": 0}
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)

        def reader() -> None:
            for _ in proc.stdout:
                counted["lines"] += 1

        if read:
            threading.Thread(target=reader, daemon=True).start()
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, peak_mib(proc.pid))
            time.sleep(0.05)
        wall = time.monotonic() - start
        err.seek(0)
        notices = [ln for ln in err.read().decode().splitlines() if "dropped" in ln]
    return {"peak": peak, "wall": wall, "lines": counted["lines"], "rc": proc.returncode, "dropped": len(notices)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", default="1,8,32,0", help="MiB/s per rank, 0 = unthrottled")
    args = ap.parse_args()
    idle = one(args.nproc, 0.0001, 1.0, read=True)["peak"]
    print(f"idle job: launcher peak RSS {idle:.1f} MiB (the reference)")
    print(f"{'rate/rank':>10} {'reader':>8} {'peak MiB':>9} {'x idle':>7} {'MiB/s out':>10} {'wall s':>7} {'rc':>3}")
    for rate in (float(r) for r in args.rates.split(",")):
        for read in (True, False):
            r = one(args.nproc, rate, args.seconds, read)
            out_rate = r["lines"] * 200 / (1 << 20) / r["wall"] if read else 0.0
            label = f"{rate:g} MiB/s" if rate else "max"
            print(
                f"{label:>10} {'reads' if read else 'stalled':>8} {r['peak']:9.1f} {r['peak'] / idle:7.2f}"
                f" {out_rate:10.1f} {r['wall']:7.1f} {r['rc']:3d}"
            )


if __name__ == "__main__":
    main()

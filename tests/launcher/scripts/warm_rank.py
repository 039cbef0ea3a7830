"""A rank that tells what it started with: whether warm_marker was imported before its first line, its session,
CPUs, environment (also as /proc shows them, with its command line), argv, sys.path[0], working directory and (with torch preloaded) torch's thread count; then
exits with EXIT_CODE on rank EXIT_RANK, or 0."""

import json
import os
import sys
from pathlib import Path

preloaded = "warm_marker" in sys.modules
threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
report = {
    "rank": int(os.environ["RANK"]),
    "preloaded": preloaded,
    "own_session": os.getsid(0) == os.getpid(),
    "cpus": sorted(os.sched_getaffinity(0)),
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "threads": threads,
    "pid": os.getpid(),
    "stdin_empty": sys.stdin.read() == "",
    "cmdline": Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").decode().split("\0"),
    "environ_rank": [e for e in Path("/proc/self/environ").read_bytes().decode().split("\0") if e.startswith("RANK=")],
}
print("REPORT " + json.dumps(report), flush=True)
print(f"rank {report['rank']} to stderr", file=sys.stderr, flush=True)
if os.environ.get("EXIT_RANK") == str(report["rank"]):
    sys.exit(int(os.environ["EXIT_CODE"]))

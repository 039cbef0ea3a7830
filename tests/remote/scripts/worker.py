"""A rank for the multi-host tests, told what to do by argv:

worker.py dump ARGS...       print one JSON line: argv and env (hex of their bytes), cwd, host address
worker.py hold [FAIL_RANK CODE]
    ignore SIGTERM and start a child (only SIGKILL of the process group ends both), print "ready",
    then wait; FAIL_RANK exits with CODE after a moment instead.
"""

import json
import os
import signal
import subprocess
import sys
import time

rank = int(os.environ["RANK"])
if sys.argv[1] == "dump":
    names = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "NNODES",
        "DISTLAUNCH_JOB_ID",
    )
    print(
        "DUMP "
        + json.dumps(
            {
                "argv_hex": [os.fsencode(a).hex() for a in sys.argv[2:]],
                "env_hex": {k: os.fsencode(v).hex() for k, v in os.environ.items()},
                "env": {k: os.environ[k] for k in names},
                "cwd": os.getcwd(),
            }
        ),
        flush=True,
    )
    sys.exit(0)

signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready rank={rank} node={os.environ['NODE_RANK']} job={os.environ['DISTLAUNCH_JOB_ID']}", flush=True)
if len(sys.argv) > 3 and rank == int(sys.argv[2]):
    time.sleep(1.0)  # let every other rank start first
    print(f"rank {rank} failing now", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[3]))
time.sleep(600)

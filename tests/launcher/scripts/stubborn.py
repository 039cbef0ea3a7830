"""Ignores SIGTERM and starts a child in its own process group's tree: only SIGKILL of the group ends both."""

import os
import signal
import subprocess
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(600)

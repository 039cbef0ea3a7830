"""Each rank leaves a child in a new session (outside its process group), then exits with EXIT_CODE."""

import os
import subprocess
import sys

subprocess.Popen(["setsid", "sleep", "301"])
print(f"rank {os.environ['RANK']} left a straggler", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))

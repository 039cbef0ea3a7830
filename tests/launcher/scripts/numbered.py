"""Each rank writes LINES numbered lines to stdout (PAD bytes each) and to stderr (a tenth of that), one after the
other, as fast as it can; then it leaves a file in DONE_DIR, so that a test knows every line is on its way."""

import os
import sys
from pathlib import Path

rank = int(os.environ["RANK"])
pad = int(os.environ["PAD"])
for i in range(int(os.environ["LINES"])):
    sys.stdout.write(f"r{rank} out {i} {'x' * pad}\n")
    sys.stderr.write(f"r{rank} err {i} {'x' * (pad // 10)}\n")
sys.stdout.flush()
sys.stderr.flush()
(Path(os.environ["DONE_DIR"]) / f"rank{rank}").touch()

"""Write ``DIR/ready-RANK``, then wait. On SIGTERM write ``DIR/term-RANK``; with ``exit`` the rank then exits
143 (a checkpoint-on-SIGTERM handler would save here), with ``ignore`` it keeps running (only SIGKILL ends it)."""

import os
import signal
import sys
import time
from pathlib import Path

folder, mode = Path(sys.argv[1]), sys.argv[2]
rank = os.environ["RANK"]


def on_term(signum, frame):
    (folder / f"term-{rank}").write_text(str(time.time()))
    if mode == "exit":
        sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
(folder / f"ready-{rank}").write_text(str(os.getpid()))
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    time.sleep(0.1)
(folder / f"ended-{rank}").write_text("ran to its end")

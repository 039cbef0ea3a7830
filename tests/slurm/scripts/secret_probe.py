"""Report whether the secret in PROBE_SECRET reached this rank, and every process whose argv shows it.

Runs while srun, slurmstepd and the launcher are alive, so /proc shows each one's command line.
"""

import os

secret = os.environ.get("HF_TOKEN", "")
leaks = []
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            argv = f.read()
    except OSError:
        continue
    if secret and secret.encode() in argv:
        leaks.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
print(f"PROBE rank={os.environ.get('RANK')} token_len={len(secret)} leaks={leaks!r}", flush=True)

"""What only a GPU shows, in one call: every check no CPU run covers, each printed under the device line.

    python bench/gpu_checks.py [--out DIR] [--only SECTION,...]   # on a machine with one CUDA GPU

Sections, in this order; each runs in its own processes under its own time limit, and one that fails or runs
out of time is reported and the next one runs (a run cut short keeps what it printed):

- ``device``: the GPU, its memory, driver, torch, CUDA and NCCL versions: the line every figure goes with;
- ``duplicate-gpu``: two NCCL ranks that both choose the one GPU: the text torch and NCCL give, and the line
  distlaunch makes of it;
- ``nccl-hang``: one NCCL rank whose all-reduce waits behind a kernel that does not end, under
  ``--hang-timeout``: the hang line, the flight-recorder dump the hang watch asks for through the dump pipe,
  and PyTorch's ``fr_trace`` reading of it;
- ``doctor``: ``distlaunch doctor`` with one NCCL rank, and ``doctor --bench`` (NCCL busbw) with two ranks on
  the one GPU (one rank has nothing to all-reduce with);
- ``template``: the 1.3b template's own settings (micro-batch 2, 8 accumulation rounds, activation
  checkpointing, ZeRO-1, bf16) scaled to one GPU (dp=tp=pp=1), beside one micro-batch of 8 without
  checkpointing (the shape ``gpu_throughput.py`` measures): tokens/s, MFU and peak memory of each;
- ``tf32``: an fp32 125m job with torch.compile, ``train.tf32`` left out, then set true: the TF32 warnings
  each prints, and tokens/s;
- ``layouts``: ``bench/gpu_layouts.py`` (two ranks on the GPU over gloo with CUDA tensors, torch.compile
  with tp=2 and with ZeRO-3, and fp16 with ZeRO-3 among them), against one rank.

Throughput against the reference loop is ``bench/gpu_throughput.py --presets 1.3b --rounds 3``. Every
command's whole output goes to ``--out`` (a new temporary folder by default), named at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DISTLAUNCH = [sys.executable, "-m", "distlaunch"]

# Both ranks choose GPU 0, as a script that ignores LOCAL_RANK does.
DUPLICATE = """
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {dist.get_rank()}: all-reduce done: {t.item()}", flush=True)
dist.destroy_process_group()
"""

# Three all-reduces, then one enqueued behind a kernel that spins for minutes: NCCL's stream waits for it, so
# the collective never starts and the host waits in synchronize (what a peer that never joins looks like from
# one rank). NCCL's own timeout is set past the hang watch's, so the watch's dump request comes first.
HANG = """
import datetime, torch, torch.distributed as dist, distlaunch
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0), timeout=datetime.timedelta(seconds=600))
t = torch.ones(1 << 20, device="cuda")
for step in range(1, 4):
    dist.all_reduce(t)
    torch.cuda.synchronize()
    distlaunch.progress(step=step)
print("three all-reduces done; the fourth waits behind a kernel that does not end", flush=True)
torch.cuda._sleep(1 << 40)
dist.all_reduce(t)
torch.cuda.synchronize()
"""


class Section:
    """Runs a section's commands, keeps each one's whole output in the out folder, prints what matters."""

    def __init__(self, name: str, out: Path):
        self.name, self.out = name, out
        self.count = 0

    def say(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            print(f"[{self.name}] {line}", flush=True)

    def run(self, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str]:
        """Run ``argv`` in its own process group (ended whole on the time limit); its exit code (None: it ran
        out of time) and its stdout and stderr together."""
        self.count += 1
        log = self.out / f"{self.name}-{self.count}.txt"
        environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", "PYTHONPATH": str(REPO), **(env or {})}
        with open(log, "w+") as f:
            f.write(f"$ {' '.join(argv)}\n")
            f.flush()
            proc = subprocess.Popen(
                argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=environ, start_new_session=True
            )
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # anything it left, on the GPU or not
                proc.wait()
            f.seek(0)
            text = f.read()
        return code, text.split("\n", 1)[1] if "\n" in text else ""

    def script(self, name: str, text: str) -> str:
        path = self.out / name
        path.write_text(text)
        return str(path)


def matching(text: str, pattern: str, limit: int = 12) -> str:
    lines = [line for line in text.splitlines() if re.search(pattern, line)]
    return "\n".join(lines[:limit]) if lines else "(no such line)"


def tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def exit_words(code: int | None) -> str:
    return "ran out of time" if code is None else f"exit {code}"


# -- the sections ------------------------------------------------------------------------------------------------


def device(s: Section) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    )
    driver = smi.stdout.strip() or "unknown"
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    s.say(
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, driver {driver}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {nccl}"
    )


def duplicate_gpu(s: Section) -> None:
    script = s.script("duplicate.py", DUPLICATE)
    code, text = s.run([*DISTLAUNCH, "run", "-n", "2", "--backend", "nccl", "--grace-period", "5", script], 180)
    s.say(f"two NCCL ranks on GPU 0: {exit_words(code)}")
    s.say(matching(text, r"(?i)duplicate|invalid usage|ncclInvalid|error|exited|all-reduce done"))


def nccl_hang(s: Section) -> None:
    logs = s.out / "hang-logs"
    script = s.script("hang.py", HANG)
    argv = [*DISTLAUNCH, "run", "-n", "1", "--backend", "nccl", "--hang-timeout", "20", "--grace-period", "5"]
    code, text = s.run([*argv, "--log-dir", str(logs), script], 240)
    s.say(f"one NCCL rank held behind a spinning kernel, --hang-timeout 20: {exit_words(code)} (goal: 124)")
    s.say(matching(text, r"hang:|flight recorder|stacks|NCCL|exit"))
    dumps = sorted(logs.glob("*/stacks/nccl_trace_rank_*"))
    for dump in dumps:
        s.say(f"dump {dump.relative_to(s.out)}: {dump.stat().st_size} bytes")
    if not dumps:
        s.say("no flight-recorder dump was stored (goal: one, for rank 0)")
        return
    reading = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps[0].parent)]
    code, text = s.run([*reading, "-p", "nccl_trace_rank_"], 120)
    s.say(f"fr_trace: {exit_words(code)}")
    s.say(tail(text, 15))


def doctor(s: Section) -> None:
    code, text = s.run([*DISTLAUNCH, "doctor", "-n", "1", "--backend", "nccl"], 120)
    s.say(f"doctor -n 1 --backend nccl: {exit_words(code)}")
    s.say(tail(text, 30))
    code, text = s.run([*DISTLAUNCH, "doctor", "-n", "2", "--backend", "nccl", "--bench"], 240)
    s.say(f"doctor -n 2 --backend nccl --bench (two ranks, one GPU): {exit_words(code)}")
    s.say(tail(text, 20))


def train_summary(s: Section, argv: list[str], limit: float) -> dict | None:
    """A ``distlaunch train`` job's summary record (None when it failed: said, with its last lines)."""
    metrics = s.out / f"{s.name}-metrics-{s.count + 1}.jsonl"
    code, text = s.run([*argv, "--metrics-file", str(metrics)], limit)
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    summary = next((r for r in reversed(records) if r.get("event") == "summary"), None)
    if code != 0 or summary is None:
        s.say(f"{exit_words(code)}, no summary:\n{tail(text, 12)}")
        return None
    summary["_output"] = text
    return summary


def figures(summary: dict) -> str:
    mfu = f"{summary['mfu'] * 100:.1f}%" if summary.get("mfu") else "n/a"
    peak = (summary.get("peak_per_rank") or [{}])[0].get("device_bytes")
    peak_text = f"{peak / 2**30:.1f} GiB" if peak else "n/a"
    return f"{summary['tokens_per_s']:,.0f} tok/s, MFU {mfu}, peak {peak_text}"


def template(s: Section) -> None:
    base = [*DISTLAUNCH, "train", "templates/train-1.3b-3d.toml", "-n", "1"]
    scaled = ["parallel.dp=1", "parallel.tp=1", "parallel.pp=1", "parallel.microbatches=1"]
    scaled += ["train.global_batch_size=16", "train.steps=12", "train.eval_every=0", "train.log_every=1"]
    runs = {
        "template settings: micro-batch 2 x 8 rounds, activation checkpointing": [],
        "micro-batch 8 x 2 rounds, no checkpointing": [
            "train.micro_batch_size=8",
            "train.grad_accum_steps=2",
            "train.activation_checkpointing=false",
        ],
    }
    for label, extra in runs.items():
        argv = list(base)
        for assignment in scaled + extra:
            argv += ["--set", assignment]
        summary = train_summary(s, argv, 420)
        if summary is not None:
            s.say(f"1.3b bf16 ZeRO-1, batch 16 x 2048, {label}: {figures(summary)}")


def tf32(s: Section) -> None:
    base = [*DISTLAUNCH, "train", "-n", "1"]
    sets = ["model.preset='125m'", "train.precision='fp32'", "train.compile=true", "train.steps=10"]
    sets += ["train.global_batch_size=8", "train.micro_batch_size=8", "train.seq_len=1024", "train.eval_every=0"]
    sets += ["parallel.dp=1", "parallel.tp=1", "parallel.pp=1"]
    for label, extra in (("train.tf32 left out", []), ("train.tf32=true", ["train.tf32=true"])):
        argv = list(base)
        for assignment in sets + extra:
            argv += ["--set", assignment]
        summary = train_summary(s, argv, 300)
        if summary is not None:
            warned = summary["_output"].count("TensorFloat32")
            s.say(f"125m fp32 compiled, {label}: {figures(summary)}; TF32 warnings printed: {warned}")


def layouts(s: Section) -> None:
    code, text = s.run([sys.executable, str(REPO / "bench" / "gpu_layouts.py")], 900)
    s.say(f"bench/gpu_layouts.py: {exit_words(code)}")
    s.say(tail(text, 20))


SECTIONS: dict[str, Callable[[Section], None]] = {
    "device": device,
    "duplicate-gpu": duplicate_gpu,
    "nccl-hang": nccl_hang,
    "doctor": doctor,
    "template": template,
    "tf32": tf32,
    "layouts": layouts,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for every command's whole output")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}")
    args = parser.parse_args()
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in SECTIONS]
    if unknown:
        sys.exit(f"error: --only {','.join(unknown)}: no such section (sections: {', '.join(SECTIONS)})")
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU is visible (torch.cuda.is_available() is False); run this on a GPU machine")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-checks-"))
    out.mkdir(parents=True, exist_ok=True)
    if "device" not in wanted:
        wanted.insert(0, "device")  # every figure goes with its device line
    for name in wanted:
        section = Section(name, out)
        started = time.monotonic()
        try:
            SECTIONS[name](section)
        except Exception as err:  # one section's mistake costs that section only
            section.say(f"failed: {type(err).__name__}: {err}")
        section.say(f"({time.monotonic() - started:.0f}s)")
    print(f"every command's whole output: {out}", flush=True)


if __name__ == "__main__":
    main()

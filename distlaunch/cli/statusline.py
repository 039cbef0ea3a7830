"""The one line a terminal shows under a running job's output, redrawn twice a second:

    step 110/200 · loss 2.1121 · 10.6k tok/s · MFU 41% · eta 21s · 0:31
    starting 4 ranks on 1 host · 0:03 · rank 0: importing torch
    4 ranks running · 1:05 · last output 3s ago

It is cut to the terminal's width, never wrapped (a wrapped line could not be erased and redrawn). A pipe gets no
status line: what a job prints there is its ranks' lines, whole."""

from __future__ import annotations

from distlaunch.contract.sink import JobStatus
from distlaunch.readable import clock, plural, rate, time_left

SEP = " · "
STALL_S = 10.0  # a silence this long is said on the line: a person sees a stall, not only a frozen number


def status_text(status: JobStatus, width: int) -> str:
    """The status line for a terminal ``width`` columns wide (at most ``width - 1`` characters: the cursor stays
    on the line, so the next redraw can erase it). Each part has a rank: where the line is too long, the least
    needed parts are left out whole (the clock first, then MFU, the ETA, tokens/s, the loss); what the job is
    and what it says (a stall, a rank's words) stay."""
    parts: list[tuple[int, str]] = []  # (rank: higher stays longer, text), in the order shown
    silence = status.since_progress_s if status.since_progress_s is not None else status.since_output_s
    if status.step is not None:
        parts.append((9, f"step {status.step}/{status.total_steps}" if status.total_steps else f"step {status.step}"))
        figures = status.metrics
        if "loss" in figures:
            parts.append((6, f"loss {figures['loss']:.4f}"))
        if "tokens_per_s" in figures:
            parts.append((5, f"{rate(figures['tokens_per_s'])} tok/s"))
        if "mfu" in figures:
            parts.append((3, f"MFU {figures['mfu']:.0%}"))
        if status.eta_s is not None:
            parts.append((4, f"eta {time_left(status.eta_s)}"))
    elif status.running < status.world_size and status.started < status.world_size:
        where = "this machine" if status.hosts == 1 else plural(status.hosts, "host")
        parts.append((9, f"starting {plural(status.world_size, 'rank')} on {where}"))
    else:
        parts.append((9, f"{plural(status.running, 'rank')} running"))
    parts.append((2, clock(status.elapsed_s)))
    if status.doing:
        parts.append((8, f"rank {status.reporter}: {status.doing}" if status.step is None else status.doing))
    elif silence is not None and silence >= STALL_S:
        what = "step" if status.step is not None else "progress" if status.since_progress_s is not None else "output"
        parts.append((8, f"no {what} for {time_left(silence)}"))
    elif status.step is None and status.since_output_s is not None and status.started:
        parts.append((1, f"last output {time_left(status.since_output_s)} ago"))
    return fit(parts, width - 1)


def fit(parts: list[tuple[int, str]], width: int) -> str:
    """Join the parts' texts, leaving out the lowest-ranked parts whole (never half a word) until the line fits
    ``width``; a single part that is still too long is cut."""
    parts = list(parts)
    while parts:
        line = SEP.join(text for _, text in parts)
        if len(line) <= width:
            return line
        if len(parts) == 1:
            return line[: max(0, width)]
        parts.remove(min(parts, key=lambda part: part[0]))  # the first of the lowest rank
    return ""

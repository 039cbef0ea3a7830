"""What the training loop calls: resume before the first step, guard each step, save when due.

Resume (``checkpoint.resume``), decided on rank 0 and broadcast so every rank loads the same one:

- ``auto`` (default): the latest checkpoint in ``checkpoint.dir`` if there is one, else a fresh
  start. Re-running a command, a ``--max-restarts`` restart and a requeued Slurm job all continue.
- ``latest``: the same, but a first try with nothing to resume is an error.
- ``never``: always a fresh start, restarts included (old checkpoints are replaced as it saves).
- a path (a ``step_N`` directory or a checkpoint root): that checkpoint on the first try; on a
  restart, this job's own latest checkpoint in ``checkpoint.dir`` once it has one.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator, Optional

import torch.distributed as dist

from distlaunch.engine.checkpoint.manifest import latest_checkpoint, resolve_checkpoint
from distlaunch.engine.fault import FaultPlan, restart_count
from distlaunch.engine.watchdog import Watchdog
from distlaunch.errors import DistlaunchError, UsageError


def resume_source(resume: str, ckpt_dir: Optional[str], tries: int) -> Optional[Path]:
    """The checkpoint to resume from (None: start fresh); see the module docstring."""
    own = latest_checkpoint(Path(ckpt_dir).expanduser()) if ckpt_dir else None
    if resume == "never":
        return None
    if resume == "auto":
        return own
    if resume == "latest":
        if ckpt_dir is None:
            raise UsageError("checkpoint.resume='latest' needs checkpoint.dir", "set --set checkpoint.dir=PATH")
        if own is None and tries == 0:
            raise UsageError(f"nothing to resume: no published checkpoint in {ckpt_dir}",
                             "check checkpoint.dir, or use checkpoint.resume='auto' to start fresh when empty")
        return own
    if tries > 0 and own is not None:
        return own  # a restart continues from this job's newest progress, not the original PATH
    return resolve_checkpoint(resume)


class Checkpointing:
    """Checkpoint, fault and watchdog hooks of one rank's training loop."""

    def __init__(self, engine, rank: int, environ: dict[str, str] | None = None):
        self.engine, self.rank = engine, rank
        self.cfg = engine.cfg
        self.tries = restart_count(environ)
        env = os.environ if environ is None else environ
        self.job = env.get("DISTLAUNCH_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or ""
        self.fault = FaultPlan.for_rank(self.cfg.fault, rank, engine.dims.world_size, self.tries,
                                        self.cfg.train.step_timeout)
        self.watchdog = Watchdog(rank)
        self.tag = f"{self.job or 'job'}-r{self.tries}"  # start() replaces it with one all ranks agree on

    def _agree(self) -> tuple[Optional[Path], str]:
        """Rank 0 picks the resume source and the save tag; every rank gets them (or its error)."""
        decision: list = [None, None, None]
        if self.rank == 0:
            try:
                source = resume_source(self.cfg.checkpoint.resume, self.cfg.checkpoint.dir, self.tries)
                decision[0] = str(source) if source else None
            except DistlaunchError as err:
                decision[1] = err
            decision[2] = f"{self.job or uuid.uuid4().hex[:8]}-r{self.tries}"
        dist.broadcast_object_list(decision, src=0)
        if decision[1] is not None:
            raise decision[1]
        return (Path(decision[0]) if decision[0] else None), decision[2]

    def start(self) -> int:
        """Agree on the resume source and the save tag (collective), load; returns the first step."""
        path, self.tag = self._agree()
        if path is None:
            return 1
        from distlaunch.engine.checkpoint.store import load_checkpoint  # DCP costs ~1 s to import: only when used

        with self.watchdog.guard(f"loading checkpoint {path}", self.cfg.checkpoint.timeout, "checkpoint.timeout"):
            meta = load_checkpoint(self.engine, self.engine.train_state, path)
        if self.rank == 0:
            saved = meta.layout
            print(f"resumed from {path} (step {meta.step}, written by dp={saved.dp},tp={saved.tp},pp={saved.pp},"
                  f"zero={saved.zero}); continuing at step {meta.step + 1}", flush=True)
        return meta.step + 1

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Run one training step under the step timeout (and the fault, if it is due)."""
        with self.watchdog.guard(f"step {step}", self.cfg.train.step_timeout, "train.step_timeout"):
            self.fault.at_step(step, self.rank)
            yield

    def due(self, step: int) -> bool:
        """Whether ``step`` ends with a save: every ``checkpoint.every`` steps and the last one."""
        ckpt = self.cfg.checkpoint
        return ckpt.dir is not None and ((ckpt.every > 0 and step % ckpt.every == 0) or step == self.cfg.train.steps)

    def after_step(self, step: int) -> Optional[Path]:
        """Save the checkpoint of ``step`` when due (collective); rank 0 gets the published path."""
        if not self.due(step):
            return None
        from distlaunch.engine.checkpoint.store import save_checkpoint  # DCP costs ~1 s to import: only when used

        ckpt = self.cfg.checkpoint
        with self.watchdog.guard(f"checkpoint save of step {step}", ckpt.timeout, "checkpoint.timeout"):
            return save_checkpoint(self.engine, self.engine.train_state, step, Path(ckpt.dir).expanduser(),
                                   ckpt.keep, self.tag, lambda: self.fault.in_save(step, self.rank))

"""What the training loop calls: resume before the first step, guard each step, save when due.

Which checkpoint to resume from is decided on rank 0 (``resume``: the rules of ``checkpoint.resume``)
and broadcast, so every rank loads the same one; each candidate is verified by all ranks together
before it is loaded, and a damaged one falls back to the next older one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from distlaunch.engine.checkpoint.integrity import DamagedCheckpoint, verify_share
from distlaunch.engine.checkpoint.resume import resume_candidates, resume_source
from distlaunch.engine.fault import FaultPlan, restart_count
from distlaunch.engine.watchdog import Watchdog
from distlaunch.errors import DistlaunchError

__all__ = ["Checkpointing", "resume_candidates", "resume_source"]


class Checkpointing:
    """Checkpoint, fault and watchdog hooks of one rank's training loop."""

    def __init__(self, engine, rank: int, environ: dict[str, str] | None = None):
        self.engine, self.rank = engine, rank
        self.cfg = engine.cfg
        self.tries = restart_count(environ)
        env = os.environ if environ is None else environ
        self.job = env.get("DISTLAUNCH_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or ""
        self.fault = FaultPlan.for_rank(
            self.cfg.fault, rank, engine.dims.world_size, self.tries, self.cfg.train.step_timeout
        )
        self.watchdog = Watchdog(rank)
        self.tag = f"{self.job or 'job'}-r{self.tries}"  # start() replaces it with one all ranks agree on

    def _agree(self) -> tuple[list[Path], str]:
        """Rank 0 picks the resume candidates and the save tag; every rank gets them (or its error)."""
        decision: list = [[], None, None]
        if self.rank == 0:
            try:
                resume = self.cfg.checkpoint.resume
                source, pointer_warning = resume_source(resume, self.cfg.checkpoint.dir, self.tries)
                if pointer_warning:
                    print(f"warning: {pointer_warning}", file=sys.stderr, flush=True)
                decision[0] = [str(p) for p in resume_candidates(source, resume, self.tries)]
            except DistlaunchError as err:
                decision[1] = err
            decision[2] = f"{self.job or uuid.uuid4().hex[:8]}-r{self.tries}"
        dist.broadcast_object_list(decision, src=0)
        if decision[1] is not None:
            raise decision[1]
        return [Path(p) for p in decision[0]], decision[2]

    def _problems(self, path: Path) -> list[str]:
        """Every rank verifies its share of ``path``'s files (collective); all ranks get every problem."""
        from distlaunch.engine.checkpoint.safe import read_dcp_metadata

        problems = verify_share(path, self.rank, dist.get_world_size())
        if self.rank == 0 and not problems:
            try:
                read_dcp_metadata(path)  # the index is unpickled with an allow-list: refuse what is not ours
            except DistlaunchError as err:
                problems.append(err.message)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, problems)
        return [p for part in gathered for p in part]

    def _choose(self, candidates: list[Path]) -> Path:
        """The first intact candidate; each damaged one is named in one line on rank 0."""
        for i, path in enumerate(candidates):
            problems = self._problems(path)
            if not problems:
                return path
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            then = f"falling back to {candidates[i + 1].name}" if i + 1 < len(candidates) else "no older checkpoint"
            if self.rank == 0:
                print(
                    f"warning: checkpoint {path} is damaged: {problems[0]}{more}; {then}", file=sys.stderr, flush=True
                )
        raise DamagedCheckpoint(
            f"no intact checkpoint to resume from (tried {', '.join(str(p) for p in candidates)})",
            "restore the checkpoint files, or set checkpoint.resume='never' to start fresh",
        )

    def start(self) -> int:
        """Agree on the resume source and the save tag (collective), verify, load; returns the first step."""
        candidates, self.tag = self._agree()
        if not candidates:
            return 1
        from distlaunch.engine.checkpoint.store import load_checkpoint  # DCP costs ~1 s to import: only when used

        with self.watchdog.guard("verifying checkpoint", self.cfg.checkpoint.timeout, "checkpoint.timeout"):
            path = self._choose(candidates)
        with self.watchdog.guard(f"loading checkpoint {path}", self.cfg.checkpoint.timeout, "checkpoint.timeout"):
            meta = load_checkpoint(self.engine, self.engine.train_state, path)
        if self.rank == 0:
            saved = meta.layout
            print(
                f"resumed from {path} (step {meta.step}, written by dp={saved.dp},tp={saved.tp},pp={saved.pp},"
                f"zero={saved.zero}); continuing at step {meta.step + 1}",
                flush=True,
            )
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

    def after_step(self, step: int) -> Path | None:
        """Save the checkpoint of ``step`` when due (collective); rank 0 gets the published path."""
        if not self.due(step):
            return None
        from distlaunch.engine.checkpoint.store import save_checkpoint  # DCP costs ~1 s to import: only when used

        ckpt = self.cfg.checkpoint
        with self.watchdog.guard(f"checkpoint save of step {step}", ckpt.timeout, "checkpoint.timeout"):
            return save_checkpoint(
                self.engine,
                self.engine.train_state,
                step,
                Path(ckpt.dir).expanduser(),
                ckpt.keep,
                self.tag,
                lambda: self.fault.in_save(step, self.rank),
            )

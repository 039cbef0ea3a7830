"""Training config: a TOML file plus ``--set section.key=value`` overrides, validated by pydantic.

Every problem becomes a ``UsageError`` naming the key, the value and what is allowed.
``checkpoint.*``, ``fault.*`` and ``train.step_timeout`` are documented in docs/checkpointing.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from distlaunch.contract.layout import Schedule, ZeroStage, parse_layout
from distlaunch.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Preset = Literal["tiny", "small", "125m", "350m", "1.3b"]
Precision = Literal["fp32", "bf16", "fp16"]
FaultKind = Literal["crash", "hang", "crash-in-save"]
LrSchedule = Literal["cosine", "constant"]
# a key whose default is derived (parallel.dp, train.micro_batch_size) also takes "auto", as in --parallel dp=auto
Derived = Annotated[int | None, BeforeValidator(lambda value: None if value == "auto" else value)]
DataFormat = Literal["auto", "text", "tokens"]
TokenDtype = Literal["uint16", "uint8", "uint32"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(_Section):
    preset: Preset = "tiny"


class TrainSection(_Section):
    steps: int = Field(100, ge=1)
    global_batch_size: int = Field(16, ge=1)
    # None: the whole per-dp-rank batch at once (pp=1) or split into parallel.microbatches (pp>1)
    micro_batch_size: Derived = Field(None, ge=1)
    seq_len: int = Field(128, ge=2)
    # forward/backward rounds per step; global batch = dp x grad_accum_steps x micro-batches x
    # micro_batch_size (docs/train.md, "Batch arithmetic")
    grad_accum_steps: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    lr_schedule: LrSchedule = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr: float | None = Field(None, ge=0)  # None: lr / 10, the end of the cosine
    weight_decay: float = Field(0.0, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)  # max global gradient norm; 0 turns clipping off
    seed: int = Field(1337, ge=0)
    precision: Precision = "fp32"
    loss_scale: float = Field(2.0**16, gt=0)  # fp16 only: the dynamic loss scale's start value
    activation_checkpointing: bool = False
    # torch.compile every transformer block; "auto" (None): on for CUDA, off on CPU
    compile: Annotated[bool | None, BeforeValidator(lambda value: None if value == "auto" else value)] = None
    # ZeRO-0/1/2: gradients are reduced in buckets of this many MiB, each launched from the
    # backward as soon as it is complete (DDP's default 25)
    bucket_mb: float = Field(25.0, gt=0)
    log_every: int = Field(1, ge=1)
    # seconds one step may take before the rank's watchdog ends it (exit 124); 0: no limit
    step_timeout: float = Field(900.0, ge=0)
    eval_every: int = Field(0, ge=0)  # evaluate the held-out split every N steps; 0: never
    eval_batches: int = Field(4, ge=1)  # global batches per evaluation


class ParallelSection(_Section):
    dp: Derived = Field(None, ge=1)  # None: WORLD_SIZE / (tp * pp)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    zero: ZeroStage = 0
    schedule: Schedule = "1f1b"
    microbatches: int | None = Field(None, ge=1)  # None: from micro_batch_size, else pp
    virtual_stages: int = Field(2, ge=1)  # stages per pp rank, interleaved schedule only


class DataSection(_Section):
    path: str | None = None  # None: the corpus bundled in distlaunch/data
    # auto: a .bin file holds tokens, anything else is UTF-8 text (byte tokens)
    format: DataFormat = "auto"
    token_dtype: TokenDtype = "uint16"  # element type of a token file (little-endian, no header)
    val_fraction: float = Field(0.1, ge=0, lt=1)  # the tail of the data, held out for evaluation


class CheckpointSection(_Section):
    dir: str | None = None
    every: int = Field(0, ge=0)
    keep: int = Field(2, ge=1)
    # auto: the latest in dir if any; latest: the same, required; never; or a checkpoint path
    resume: str = Field("auto", min_length=1)
    timeout: float = Field(1800.0, ge=0)  # seconds one save or load may take; 0: no limit


class FaultSection(_Section):
    rank: int | None = Field(None, ge=0)
    step: int | None = Field(None, ge=1)
    kind: FaultKind = "crash"
    every_try: bool = False  # False: only when DISTLAUNCH_RESTART_COUNT is 0, so a restart recovers


class TrainingConfig(_Section):
    """The whole training config; sections mirror the TOML tables."""

    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    parallel: ParallelSection = ParallelSection()
    data: DataSection = DataSection()
    checkpoint: CheckpointSection = CheckpointSection()
    fault: FaultSection = FaultSection()


def _parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, quoted strings); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``section.key=value`` to the raw config dict."""
    key, sep, value = assignment.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise UsageError(
            f"bad --set {assignment!r}: expected section.key=value",
            "for example --set train.steps=50",
        )
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise UsageError(f"bad --set {assignment!r}: {section} is not a table", "use section.key=value")
    table[name] = _parse_value(value.strip())


def merge_parallel_env(raw: dict, spec: str) -> None:
    """Fold DISTLAUNCH_PARALLEL into ``raw['parallel']``; a different explicit value is an error."""
    table = raw.setdefault("parallel", {})
    for key, value in parse_layout(spec, "DISTLAUNCH_PARALLEL").items():
        if value is None:  # dp=auto: whatever the config says
            continue
        if table.get(key, "auto") != "auto" and table[key] != value:  # "auto" in the config: the launcher decides
            raise UsageError(
                f"parallel.{key}={table[key]!r} in the config conflicts with "
                f"{key}={value!r} from --parallel (DISTLAUNCH_PARALLEL={spec!r})",
                "set it in one place only",
            )
        table[key] = value


def _error_from_validation(err: ValidationError) -> UsageError:
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        section = str(first["loc"][0])
        owner = TrainingConfig.model_fields.get(section)
        if owner is None or len(first["loc"]) == 1:
            allowed = ", ".join(TrainingConfig.model_fields)
            return UsageError(f"unknown config section {key!r}", f"sections are: {allowed}")
        allowed = ", ".join(f"{section}.{k}" for k in owner.annotation.model_fields)
        return UsageError(f"unknown config key {key!r}", f"keys in [{section}] are: {allowed}")
    value = first.get("input")
    expected = first.get("ctx", {}).get("expected")
    hint = f"allowed values: {expected}" if expected else first["msg"]
    return UsageError(f"bad value for {key}: {value!r}", hint)


def validate_config(raw: dict) -> TrainingConfig:
    """Validate a raw dict into a TrainingConfig, or raise a one-line UsageError."""
    try:
        return TrainingConfig.model_validate(raw)
    except ValidationError as err:
        raise _error_from_validation(err) from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    parallel_env: str | None = None,
) -> TrainingConfig:
    """Read the TOML file (optional), apply ``--set`` overrides and the launcher's parallel spec."""
    raw: dict = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"config file not found: {path}", "check the path") from None
        except tomllib.TOMLDecodeError as err:
            raise UsageError(f"config file {path} is not valid TOML: {err}", "fix the line named") from None
        except (OSError, UnicodeDecodeError) as err:
            reason = "is a directory" if Path(path).is_dir() else f"cannot be read as UTF-8 text ({type(err).__name__})"
            raise UsageError(f"config file {path} {reason}", "pass the path of a TOML file") from None
    for assignment in overrides:
        apply_override(raw, assignment)
    if parallel_env:
        merge_parallel_env(raw, parallel_env)
    return validate_config(raw)

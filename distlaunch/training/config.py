"""Training config: a TOML file plus ``--set section.key=value`` overrides, validated by pydantic.

Every problem becomes a ``UsageError`` naming the key, the value and what is allowed.
``checkpoint.*``, ``fault.*`` and ``train.step_timeout`` are documented in docs/checkpointing.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from distlaunch.contract.layout import LAYOUT_KEYS, LayoutSpec, Schedule, parse_layout
from distlaunch.errors import UsageError, closest
from distlaunch.files import os_error_words, read_settings
from distlaunch.training.aliases import KEY_ALIASES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Preset = Literal["tiny", "small", "125m", "350m", "1.3b"]
Precision = Literal["fp32", "bf16", "fp16"]
ReduceDtype = Literal["fp32", "bf16"]  # train.reduce_dtype: what gradients travel in (precision.reduce_dtype_name)
FaultKind = Literal["crash", "hang", "crash-in-save", "slow"]
LrSchedule = Literal["cosine", "constant"]
Tracker = Literal["tensorboard", "wandb"]  # train.report_to, the Hugging Face Trainer's name (engine/tracking.py)
TRACKERS: tuple[str, ...] = get_args(Tracker)


def _not_bool(value: Any) -> Any:
    """Refuse a bool in a number key: pydantic takes true as 1, so ``steps = true`` would train one step.
    Its other coercions stay, so ``--set train.steps=1e4`` (a TOML float) and ``--set train.lr=.5``
    (not TOML, so a string) still work."""
    if isinstance(value, bool):
        raise ValueError("a number is needed here, not true or false")
    return value


def _only_bool(value: Any) -> Any:
    """A switch takes true or false (TOML's), not 1 or "yes": the reverse of ``_not_bool``."""
    if value is not None and not isinstance(value, bool):
        raise ValueError("true or false is needed here")
    return value


def _trackers(value: Any) -> Any:
    """``train.report_to``: a TOML list, or the comma-separated string ``--set train.report_to=tensorboard,wandb``
    gives; each name once. An unknown name is refused here, with the whole value: pydantic's own error would
    name a list index (train.report_to.1) instead of the key the user wrote."""
    names = [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value
    if not isinstance(names, list):
        raise ValueError(f"a list of {', '.join(TRACKERS)} is needed here")
    for name in names:
        if name not in TRACKERS:
            raise ValueError(
                f"{name!r} is not one of: {', '.join(TRACKERS)} (one or both, e.g. train.report_to=tensorboard,wandb)"
            )
    return list(dict.fromkeys(names))


def _switch_or_auto(value: Any) -> Any:
    """A switch that also takes "auto" (None: the engine decides)."""
    if value == "auto" or value is None:
        return None
    if not isinstance(value, bool):
        raise ValueError("true, false or 'auto' is needed here")
    return value


def _auto(value: Any) -> Any:
    """A derived setting's "auto" (None: the engine's rule decides), as ``parallel.dp=auto`` is."""
    return None if value == "auto" else value


Bool = Annotated[bool, BeforeValidator(_only_bool)]
Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]
OptionalInt = Annotated[int | None, BeforeValidator(_not_bool)]
# a key whose default is derived (parallel.dp, train.micro_batch_size) also takes "auto", as in --parallel dp=auto
Derived = Annotated[OptionalInt, BeforeValidator(_auto)]
DataFormat = Literal["auto", "text", "tokens"]
TokenDtype = Literal["uint16", "uint8", "uint32"]
# The watchdog's longest deadline: far beyond any step, save or load, and far below what
# threading's waits accept (threading.TIMEOUT_MAX, ~292 years); 0 turns a timeout off instead.
MAX_TIMEOUT_S = 30 * 24 * 3600
DEFAULT_GLOBAL_BATCH = 16  # sequences per step, over all data-parallel ranks
TIMEOUT_HINT = "seconds, 30 days at most; 0 turns the limit off"


def ranks_path(path: str, workdir: str | None) -> str:
    """A path of the config (``data.path``, ``checkpoint.dir``, a resume path) as the ranks open it: ``~``
    expanded, a relative path taken from their working directory (``--workdir``; None: this one)."""
    full = Path(path).expanduser()
    return str(full if full.is_absolute() or workdir is None else Path(workdir).expanduser() / full)


def _path(default: str) -> AfterValidator:
    """A path key that may be left out (``default`` then) but not left empty: an empty path is the
    current folder, which nobody means by writing nothing."""

    def check(value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"an empty path; leave the key out for {default}, or name a path ('.' for this folder)")
        return value

    return AfterValidator(check)


class _Section(BaseModel):
    # inf and nan are never a setting: an inf lr trains to nan, an inf timeout overflows the watchdog
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSection(_Section):
    preset: Preset = "tiny"


class TrainSection(_Section):
    """Every default here is what ``distlaunch train`` and ``python -m distlaunch.engine`` train with when no config
    says otherwise (the embedded template adds its layout, its micro-batches and how often it reports): tuned for
    the tiny preset on the bundled corpus, whose loss falls from ~5.6 to ~1.9 in these 200 steps. How often a job
    reports (``log_every``, ``eval_every``) changes no step it trains: every step is logged and nothing is held
    out for evaluation unless asked, so a config that sets ``data.val_fraction = 0`` needs nothing else."""

    steps: Int = Field(200, ge=1)
    # "auto": this default, made a multiple of what the layout splits it by (training/dims.py fit_global_batch);
    # distlaunch train asks for it where the user gave the ranks but no batch
    global_batch_size: Derived = Field(DEFAULT_GLOBAL_BATCH, ge=1)
    # None: the whole per-dp-rank batch at once (pp=1) or split into parallel.microbatches (pp>1)
    micro_batch_size: Derived = Field(None, ge=1)
    seq_len: Int = Field(128, ge=2)
    # forward/backward rounds per step; global batch = dp x grad_accum_steps x micro-batches x
    # micro_batch_size (docs/train.md, "Batch arithmetic")
    grad_accum_steps: Int = Field(1, ge=1)
    lr: Float = Field(3e-3, gt=0)
    lr_schedule: LrSchedule = "cosine"
    warmup_steps: Int = Field(20, ge=0)
    min_lr: Annotated[float | None, BeforeValidator(_not_bool)] = Field(
        None, ge=0
    )  # None: lr / 10, the end of the cosine; at most lr
    weight_decay: Float = Field(0.1, ge=0)  # AdamW, decoupled; weight matrices only
    beta1: Float = Field(0.9, ge=0, lt=1)
    beta2: Float = Field(0.95, ge=0, lt=1)
    grad_clip: Float = Field(1.0, ge=0)  # max global gradient norm; 0 turns clipping off
    # below 2**32: the engine seeds torch generators with seed * 1_000_003 + a small offset, which
    # must stay below 2**64 (torch refuses larger seeds)
    seed: Int = Field(1337, ge=0, lt=2**32)
    precision: Precision = "fp32"
    # what ZeRO-0/1/2/3 reduce the gradients in; "auto" (None): bf16 when precision is bf16, else fp32
    reduce_dtype: Annotated[ReduceDtype | None, BeforeValidator(_auto)] = None
    # TF32 tensor cores for fp32 matmuls and convolutions on CUDA GPUs (no effect on CPUs); None
    # (left out): off, so fp32 stays true fp32 (precision.apply_tf32)
    tf32: Annotated[bool | None, BeforeValidator(_only_bool)] = None
    loss_scale: Float = Field(2.0**16, gt=0)  # fp16 only: the dynamic loss scale's start value
    activation_checkpointing: Bool = False
    # torch.compile every transformer block; "auto" (None): on for CUDA, off on CPU
    compile: Annotated[bool | None, BeforeValidator(_switch_or_auto)] = None
    # ZeRO-0/1/2: gradients are reduced in buckets of this many MiB, each launched from the
    # backward as soon as it is complete (DDP's default 25); at most 64 GiB: a bucket larger than
    # all of a model's gradients is one bucket of them all, so more would change nothing
    bucket_mb: Float = Field(25.0, gt=0, le=65536)
    log_every: Int = Field(1, ge=1)  # a piped rank 0 prints every N steps; metrics are read every N steps
    # seconds one step may take before the rank's watchdog ends it (exit 124); 0: no limit
    step_timeout: Float = Field(900.0, ge=0, le=MAX_TIMEOUT_S, description=TIMEOUT_HINT)
    eval_every: Int = Field(0, ge=0)  # evaluate the held-out split every N steps and at the last; 0: never
    eval_batches: Int = Field(4, ge=1)  # global batches per evaluation
    # where rank 0 also sends the metrics: TensorBoard event files, a W&B run; none by default
    report_to: Annotated[list[Tracker], BeforeValidator(_trackers)] = Field(default_factory=list)

    def check_min_lr(self) -> None:
        """The cosine decays from lr to min_lr: a min_lr above lr would make it climb."""
        if self.min_lr is not None and self.min_lr > self.lr and self.lr_schedule != "constant":  # unused there
            raise UsageError(
                f"train.min_lr={self.min_lr:g} is above train.lr={self.lr:g}: "
                "the learning rate would climb towards min_lr instead of decaying",
                f"set train.min_lr to at most {self.lr:g}, or leave it out (lr / 10)",
            )


class ParallelSection(LayoutSpec):
    """``[parallel]``: the contract's layout, its keys, their order and bounds (dp None: WORLD_SIZE / (tp * pp);
    microbatches None: from micro_batch_size, else pp), with the engine's own schedule and virtual stages where
    the user leaves them out."""

    model_config = _Section.model_config
    schedule: Schedule = "1f1b"
    virtual_stages: int = Field(2, ge=1)  # stages per pp rank, interleaved schedule only

    @field_validator(*(key for key in LAYOUT_KEYS if key != "schedule"), mode="before")
    @classmethod
    def _no_bools(cls, value: Any) -> Any:
        return _not_bool(value)  # zero = true would be ZeRO-1

    @field_validator("dp", mode="before")
    @classmethod
    def _dp_auto(cls, value: Any) -> Any:
        return _auto(value)


class DataSection(_Section):
    path: Annotated[str | None, _path("the bundled corpus")] = None  # None: the corpus in distlaunch/data
    # auto: a .bin file holds tokens, anything else is UTF-8 text (byte tokens)
    format: DataFormat = "auto"
    token_dtype: TokenDtype = "uint16"  # element type of a token file (little-endian, no header)
    val_fraction: Float = Field(0.1, ge=0, lt=1)  # the tail of the data, held out for evaluation


class CheckpointSection(_Section):
    dir: Annotated[str | None, _path("no checkpoints")] = None
    every: Int = Field(0, ge=0)
    keep: Int = Field(2, ge=1)
    # auto: the latest in dir if any; latest: the same, required; never; or a checkpoint path
    resume: str = Field("auto", min_length=1)
    # seconds one save or load may take; 0: no limit
    timeout: Float = Field(1800.0, ge=0, le=MAX_TIMEOUT_S, description=TIMEOUT_HINT)


class FaultSection(_Section):
    rank: OptionalInt = Field(None, ge=0)
    step: OptionalInt = Field(None, ge=1)
    kind: FaultKind = "crash"
    every_try: Bool = False  # False: only when DISTLAUNCH_RESTART_COUNT is 0, so a restart recovers
    factor: Float = Field(2.0, gt=0)  # kind "slow": the rank's compute takes this many times as long (above 1)


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


def merge_parallel_env(raw: dict, spec: str, what: str = "the config") -> None:
    """Fold a layout into ``raw['parallel']``; a different explicit value there is an error (``what`` says
    where that value came from). ``dp=auto`` leaves dp as it is."""
    table = raw.setdefault("parallel", {})
    for key, value in parse_layout(spec, "DISTLAUNCH_PARALLEL").items():
        if value is None:  # dp=auto: whatever the config says
            continue
        if table.get(key, "auto") != "auto" and table[key] != value:  # "auto" in the config: the launcher decides
            raise UsageError(
                f"parallel.{key}={table[key]!r} in {what} conflicts with "
                f"{key}={value!r} from --parallel (DISTLAUNCH_PARALLEL={spec!r})",
                "set it in one place only",
            )
        table[key] = value


def check_file_layout(path: str | Path, parallel: str | None) -> None:
    """A config file the user wrote against their own ``--parallel``, before the launch: two things the user
    wrote that disagree are an error (the ranks let the launcher's layout replace the file's)."""
    if parallel:
        merge_parallel_env(read_config_file(path), parallel)


def _error_from_validation(err: ValidationError) -> UsageError:
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return _unknown_key(key, [str(part) for part in first["loc"]])
    value = first.get("input")
    expected = first.get("ctx", {}).get("expected")
    hint = f"allowed values: {expected}" if expected else first["msg"].removeprefix("Value error, ")
    if len(first["loc"]) == 2:  # section.key: add what the key means where the bound alone does not say
        section, name = (str(part) for part in first["loc"])
        owner = TrainingConfig.model_fields.get(section)
        field = owner.annotation.model_fields.get(name) if owner else None
        if field is not None and field.description:
            hint += f" ({field.description})"
    return UsageError(f"bad value for {key}: {value!r}", hint)


def _unknown_key(key: str, loc: list[str]) -> UsageError:
    """An unknown section or key, with the one it most likely meant: a key of another section (``train.preset``
    is model.preset), else the closest spelling (``train.stepz``); the whole list only when none is close."""
    sections = TrainingConfig.model_fields
    owner = sections.get(loc[0])
    if owner is None or len(loc) == 1:
        near = closest(loc[0], sections)
        hint = f"did you mean [{near}]?" if near else f"sections are: {', '.join(sections)}"
        return UsageError(f"unknown config section {key!r}", hint)
    keys = [f"{name}.{k}" for name, section in sections.items() for k in section.annotation.model_fields]
    moved = [full for full in keys if full.split(".")[1] == loc[1]]  # in another section
    near = moved[0] if moved else KEY_ALIASES.get(loc[1])  # another trainer's name for it
    if near is None:  # a typo of the name, in its own section first (whole keys would all share "train.")
        typo = closest(loc[1], owner.annotation.model_fields)
        everywhere = {k.split(".")[1]: k for k in reversed(keys)}  # a name two sections share: the first one's
        near = f"{loc[0]}.{typo}" if typo else everywhere.get(closest(loc[1], everywhere) or "")
    if near is None:
        allowed = ", ".join(f"{loc[0]}.{k}" for k in owner.annotation.model_fields)
        return UsageError(f"unknown config key {key!r}", f"keys in [{loc[0]}] are: {allowed}")
    return UsageError(f"unknown config key {key!r}", f"did you mean {near}?")


def validate_config(raw: dict) -> TrainingConfig:
    """Validate a raw dict into a TrainingConfig, or raise a one-line UsageError."""
    try:
        return TrainingConfig.model_validate(raw)
    except ValidationError as err:
        raise _error_from_validation(err) from None


def read_config_file(path: str | Path) -> dict:
    """The TOML file as a raw dict, or a one-line UsageError."""
    try:
        return tomllib.loads(read_settings(path))
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}", "check the path") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"config file {path} is not valid TOML: {err}", "fix the line named") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(
            f"config file {path} cannot be read: {os_error_words(err)}", "pass the path of a TOML file"
        ) from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    parallel_env: str | None = None,
) -> TrainingConfig:
    """Read the TOML file (optional), then the command line, which outranks the file: the launcher's layout
    (DISTLAUNCH_PARALLEL, the one channel a rank's layout comes by) and the ``--set`` overrides. A ``--set``
    that contradicts the layout is an error: both were written on the command line."""
    for assignment in overrides:  # their form first: `--set train.steps 50` leaves 50 where CONFIG goes
        apply_override({}, assignment)
    raw: dict = read_config_file(path) if path is not None else {}
    check_parallel_conflict(overrides, parallel_env)
    for key, value in parse_layout(parallel_env, "DISTLAUNCH_PARALLEL").items():
        raw.setdefault("parallel", {})[key] = "auto" if value is None else value
    for assignment in overrides:
        apply_override(raw, assignment)
    cfg = validate_config(raw)
    cfg.train.check_min_lr()
    return cfg


def check_parallel_conflict(overrides: list[str], parallel_env: str | None) -> None:
    """``--set`` against ``--parallel``, both written by the user: a conflict is a UsageError. Nothing else is
    checked here: the values are validated with the config they end up in."""
    raw: dict = {}
    for assignment in overrides:
        apply_override(raw, assignment)
    if parallel_env:
        merge_parallel_env(raw, parallel_env, "--set")

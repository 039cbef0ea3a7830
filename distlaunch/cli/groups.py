"""The groups of launch options commands take (``PROGRAM``, ``LAUNCH_OPTIONS``, ``HOST_OPTIONS``,
``NODE_OPTIONS``), and ``with_options``, the decorator that adds a group to a command and hands the command one
object built from the values: each option is declared once (its annotation in options.py), whichever commands take
it. An option may have an alias: a hidden second spelling (another tool's word for it) whose value it takes."""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, get_args

import typer
from pydantic import BaseModel

from distlaunch.backends.base import LaunchRequest
from distlaunch.cli.options import (
    AcceptNewHostKeys,
    Backend,
    CpuBind,
    Detach,
    DryRun,
    Env,
    Exclude,
    ForwardSignals,
    GracePeriod,
    HangReport,
    HangTimeout,
    HeartbeatTimeout,
    Hostfile,
    Include,
    Json,
    Launcher,
    LocalRanksFilter,
    LogDir,
    LogMaxSize,
    MasterAddr,
    MasterPort,
    MaxRestarts,
    Module,
    NNodes,
    NodeRank,
    NodeRankAlias,
    NoPython,
    NprocPerNode,
    OnStraggler,
    ParallelOpt,
    ParameterSource,
    Preload,
    Probe,
    Program,
    Python,
    RdzvEndpoint,
    RdzvEndpointAlias,
    RdzvTimeout,
    RemotePython,
    SaveSignal,
    SshConfig,
    Workdir,
    given_flags,
    parse_local_ranks,
)
from distlaunch.contract.options import ExecOptions, LaunchOptions, NodeOptions
from distlaunch.errors import UsageError
from distlaunch.launcher.elastic.healing import DEFAULT_MAX_RESTARTS, node_range
from distlaunch.launcher.supervising.requests import check_signals

# -- the groups of options commands take, and how a command takes them ------------------------------------------


@dataclass(frozen=True)
class Opt:
    """One command-line parameter, declared once: its name (also the name of the model field it fills, where a
    model has one), its typer annotation (flags, help, panel, parser) and its default."""

    name: str
    annotation: Any
    default: Any = inspect.Parameter.empty  # empty: required (the program)
    alias_of: str | None = None  # a hidden second spelling of the option of that name: its value goes there


_SUPERVISION = ExecOptions()  # the supervision defaults: ExecOptions owns them, the options show them
PROGRAM = (Opt("program", Program), Opt("module", Module, False), Opt("no_python", NoPython, False))
# In the order --help lists them; the defaults are what each parameter gets when not typed.
LAUNCH_OPTIONS = (
    Opt("hostfile", Hostfile, None),
    Opt("nproc_per_node", NprocPerNode, None),
    Opt("parallel", ParallelOpt, None),
    Opt("include", Include, None),
    Opt("exclude", Exclude, None),
    Opt("master_addr", MasterAddr, None),
    Opt("master_port", MasterPort, "auto"),
    Opt("backend", Backend, "auto"),
    Opt("cpu_bind", CpuBind, "auto"),
    Opt("preload", Preload, "auto"),
    Opt("max_restarts", MaxRestarts, _SUPERVISION.max_restarts),
    Opt("log_dir", LogDir, None),
    Opt("log_max_size", LogMaxSize, f"{_SUPERVISION.log_max_size >> 20}MiB"),
    Opt("env", Env, None),
    Opt("ssh_config", SshConfig, None),
    Opt("python", Python, None),
    Opt("accept_new_host_keys", AcceptNewHostKeys, False),
    Opt("remote_python", RemotePython, None),
    Opt("workdir", Workdir, None),
    Opt("grace_period", GracePeriod, _SUPERVISION.grace_period),
    Opt("heartbeat_timeout", HeartbeatTimeout, _SUPERVISION.heartbeat_timeout),
    Opt("local_ranks_filter", LocalRanksFilter, None),
    Opt("hang_timeout", HangTimeout, _SUPERVISION.hang_timeout),
    Opt("hang_report", HangReport, _SUPERVISION.hang_report),
    Opt("on_straggler", OnStraggler, _SUPERVISION.on_straggler),
    Opt("save_signal", SaveSignal, _SUPERVISION.save_signal),
    Opt("forward_signals", ForwardSignals, None),
    Opt("dry_run", DryRun, False),
    Opt("probe", Probe, False),
    Opt("detach", Detach, False),
    Opt("json_output", Json, False),
    Opt("launcher", Launcher, "auto"),
)
NODE_OPTIONS = (
    Opt("nnodes", NNodes, None),
    Opt("node_rank", NodeRank, None),
    Opt("node_rank_alias", NodeRankAlias, None),
    Opt("rdzv_endpoint", RdzvEndpoint, None),
    Opt("rdzv_endpoint_alias", RdzvEndpointAlias, None),
    Opt("rdzv_timeout", RdzvTimeout, NodeOptions.model_fields["rdzv_timeout"].default),
)


def _known(group: Iterable[Opt], names: Iterable[str]) -> tuple[Opt, ...]:
    group = tuple(group)
    unknown = set(names) - {opt.name for opt in group}
    if unknown:
        raise ValueError(f"no such option: {', '.join(sorted(unknown))}")
    return group


def pick(group: Iterable[Opt], *names: str) -> tuple[Opt, ...]:
    """The options of ``group`` with these names, in the group's order (the order --help lists them in)."""
    group = _known(group, names)
    return tuple(opt for opt in group if opt.name in names)


# How distlaunch reaches hosts: every command that talks to them takes these (run, train, doctor, hosts).
HOST_OPTIONS = pick(
    LAUNCH_OPTIONS, "hostfile", "include", "exclude", "ssh_config", "accept_new_host_keys", "remote_python"
)


def retold(group: Iterable[Opt], **helps: str) -> tuple[Opt, ...]:
    """The options of ``group``, those named in ``helps`` with that help text instead: for a command where one does
    less or prints something else (train's --nnodes has no per-node mode; slurm sbatch's --json is the job)."""
    return _changed(group, {name: {"help": text} for name, text in helps.items()})


def hidden(group: Iterable[Opt], *names: str) -> tuple[Opt, ...]:
    """The options of ``group``, those named taken but left out of --help: where the command shows its own word
    for the same thing (slurm's --ntasks-per-node for -n/--nproc-per-node)."""
    return _changed(group, {name: {"hidden": True} for name in names})


def _changed(group: Iterable[Opt], changes: dict[str, dict[str, Any]]) -> tuple[Opt, ...]:
    """The options of ``group``, those named in ``changes`` with these attributes of their typer.Option changed."""
    return tuple(
        replace(opt, annotation=_with(opt.annotation, changes[opt.name])) if opt.name in changes else opt
        for opt in _known(group, changes)
    )


def _with(annotation: Any, changes: dict[str, Any]) -> Any:
    kind, info, *rest = get_args(annotation)  # Annotated[type, typer.Option(...)]
    told = copy.copy(info)
    for name, value in changes.items():
        setattr(told, name, value)
    return Annotated[(kind, told, *rest)]


def fields_of(model: type[BaseModel], values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that fill ``model``'s fields, by name; an option left unset (None) takes the model's default."""
    return {name: value for name, value in values.items() if name in model.model_fields and value is not None}


def _evaluated(annotation: Any, command: Callable) -> Any:
    """An annotation as an object (``from __future__ import annotations`` leaves a string), as typer needs it."""
    return eval(annotation, command.__globals__) if isinstance(annotation, str) else annotation


def with_options(
    *groups: Iterable[Opt], build: Callable[[dict[str, Any], typer.Context], Any], into: str = "launch", **defaults: Any
) -> Callable[[Callable], Callable]:
    """Add the options of ``groups`` to the decorated command's parameters, where its parameter ``into`` is, and
    hand it ``build(values, ctx)`` there: ``values`` has each option's value by name, as parsed or its default.
    ``defaults`` gives an option another default for this command.

    typer reads a command's parameters from ``inspect.signature`` (``__signature__`` when set) and their types from
    ``__annotations__``: both are set on the wrapper, every option with its annotation from ``groups``, so every
    command that takes an option has the same flags, help, panel and parser for it.
    """
    opts = [replace(o, default=defaults.pop(o.name)) if o.name in defaults else o for group in groups for o in group]
    if defaults:
        raise ValueError(f"no such option: {', '.join(defaults)}")
    names = [o.name for o in opts]
    aliases = [o for o in opts if o.alias_of is not None]
    keyword = inspect.Parameter.KEYWORD_ONLY  # typer passes every parameter by name
    shared = [inspect.Parameter(o.name, keyword, default=o.default, annotation=o.annotation) for o in opts]

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        if into not in signature.parameters:
            raise TypeError(f"{command.__name__}() has no parameter {into!r} to take the options")
        params = [inspect.Parameter("ctx", keyword, annotation=typer.Context)]  # for build
        for param in signature.parameters.values():
            if param.name == into:
                params += shared
            else:
                params.append(param.replace(kind=keyword, annotation=_evaluated(param.annotation, command)))

        @functools.wraps(command)
        def wrapper(ctx: typer.Context, **kwargs: Any) -> Any:
            values = with_aliases({name: kwargs.pop(name) for name in names}, aliases, ctx)
            return command(**kwargs, **{into: build(values, ctx)})

        returns = _evaluated(signature.return_annotation, command)
        wrapper.__signature__ = inspect.Signature(params, return_annotation=returns)
        wrapper.__annotations__ = {**{p.name: p.annotation for p in params}, "return": returns}
        return wrapper

    return decorate


def with_aliases(values: dict[str, Any], aliases: Iterable[Opt], ctx: typer.Context) -> dict[str, Any]:
    """``values`` with each alias's value moved to its option (an alias left out: None); an alias and its option
    both typed, with two values, is one line and exit 2."""
    values = dict(values)
    flags = {param.name: max(param.opts, key=len) for param in ctx.command.params}
    for alias in aliases:
        value = values.pop(alias.name)
        if value is None:
            continue
        typed = ctx.get_parameter_source(alias.alias_of) == ParameterSource.COMMANDLINE
        if typed and values[alias.alias_of] != value:
            own, other = flags[alias.alias_of], flags[alias.name]
            raise UsageError(
                f"{other} {value} and {own} {values[alias.alias_of]} are one option given twice", f"give {own} once"
            )
        values[alias.alias_of] = value
    return values


def spares_given(values: Mapping[str, Any]) -> bool:
    """``--nnodes`` with a hostfile and no per-node option: a job with spares (launcher/elastic/healing.py)."""
    per_node = ("node_rank", "node_rank_alias", "rdzv_endpoint", "rdzv_endpoint_alias")
    return (
        values.get("nnodes") is not None
        and values.get("hostfile") is not None
        and not any(values.get(name) is not None for name in per_node)
    )


def parse_count(flag: str, text: str) -> int:
    """A whole number typed for ``flag`` (its range is checked where it is used)."""
    if not text.strip().lstrip("-").isdigit():
        raise UsageError(f"{flag} {text!r} is not a whole number", f"write e.g. {flag} 2")
    return int(text)


def command_line() -> list[str]:
    """This command as the user typed it (kept in the job record)."""
    return ["distlaunch", *sys.argv[1:]]


@dataclass(frozen=True)
class LaunchArgs:
    """The launch options of a ``run`` or ``train`` command line: each one's value by name (``launch.hostfile``,
    ``launch.dry_run``, ...), and the models built from them, here only."""

    values: dict[str, Any]
    supervision_given: list[str]  # supervision flags typed on the command line (given_flags)

    @classmethod
    def of(cls, values: dict[str, Any], ctx: typer.Context) -> LaunchArgs:
        values = dict(values)
        if spares_given(values) and not given_flags(ctx, ("max_restarts",)):
            values["max_restarts"] = DEFAULT_MAX_RESTARTS  # a job with spares recovers without being asked to
        return cls(values, given_flags(ctx))

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def options(self, **changes: Any) -> LaunchOptions:
        """The core launch options as typed; ``changes`` replace some (train: what its config decides)."""
        nodes = node_range(self.values["nnodes"]) if spares_given(self.values) else None
        if nodes is None and self.values.get("nnodes") is not None and "node_rank" not in self.values:
            raise UsageError(  # train: no per-node mode
                f"--nnodes {self.values['nnodes']} needs a hostfile: distlaunch starts every host of it itself",
                "pass -H HOSTFILE; its hosts after the first MAX of --nnodes MIN:MAX are spares",
            )
        return LaunchOptions(**fields_of(LaunchOptions, {**self.values, "nodes": nodes, **changes}))

    def exec_options(self) -> ExecOptions:
        local_ranks = parse_local_ranks(self.values["local_ranks_filter"])
        # a list option parsed per occurrence: --forward-signals USR1,USR2 --forward-signals WINCH
        forward = list(dict.fromkeys(n for names in self.values.get("forward_signals") or [] for n in names))
        check_signals(self.values.get("save_signal"), forward)
        values = {**self.values, "local_ranks_filter": local_ranks, "forward_signals": forward}
        return ExecOptions(**fields_of(ExecOptions, values))

    def node_options(self) -> NodeOptions | None:
        """The per-node options, when one is given (per-node mode, docs/multinode.md); else None."""
        if "node_rank" not in self.values or spares_given(self.values):  # a command without them; spares
            return None
        nnodes, alias = self.values["nnodes"], self.values["node_rank_alias"]
        node_rank = self.values["node_rank"] if self.values["node_rank"] is not None else alias
        rdzv_endpoint = self.values["rdzv_endpoint"] or self.values["rdzv_endpoint_alias"]
        if nnodes is None and node_rank is None and rdzv_endpoint is None:
            return None
        if nnodes is not None and ":" in nnodes:
            raise UsageError(
                f"--nnodes {nnodes}: a MIN:MAX range needs a hostfile, whose hosts after the first MAX are spares",
                "pass -H HOSTFILE (distlaunch starts every host); per-node mode takes a fixed node count",
            )
        return NodeOptions(
            nnodes=1 if nnodes is None else parse_count("--nnodes", nnodes),
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_timeout=self.values["rdzv_timeout"],
        )

    def request(self, opts: LaunchOptions) -> LaunchRequest:
        """What the backend is handed: ``opts`` (see ``options``) and the rest of the options."""
        return LaunchRequest(
            opts=opts,
            exec_opts=self.exec_options(),
            node=self.node_options(),
            launcher=self.launcher,
            command=command_line(),
            supervision_given=self.supervision_given,
            dry_run=bool(self.values.get("dry_run")),
            probe=bool(self.values.get("probe")),
        )


def launch_options(*groups: Iterable[Opt], **defaults: Any) -> Callable[[Callable], Callable]:
    """``with_options`` for ``run`` and ``train``: the command takes the options as ``launch: LaunchArgs``."""
    return with_options(*groups, build=LaunchArgs.of, into="launch", **defaults)

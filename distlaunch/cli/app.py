"""The ``distlaunch`` command. ``main`` is the one place where errors become messages and exit codes."""

from __future__ import annotations

import os
import secrets
import signal
import stat
import sys
import tempfile
import time
import traceback

import typer

from distlaunch import __version__, interrupts
from distlaunch.cli import notices
from distlaunch.cli.commands import LazyCommands
from distlaunch.cli.helpfmt import plain_help
from distlaunch.cli.peers import check_peer_spellings, peer_equivalent
from distlaunch.cli.pipes import drop_unread_output, reader_gone
from distlaunch.cli.train_flags import trainer_flag
from distlaunch.errors import DistlaunchError, ExitCode, Interrupted

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as cx

plain_help()
app = typer.Typer(
    name="distlaunch",
    cls=LazyCommands,  # each command's module is imported when that command runs (cli/commands.py)
    # the list of commands in click's plain layout: typer's boxed one imports rich's markdown and traceback
    # modules, which cost more than typer itself; each command's own --help keeps the boxes
    rich_markup_mode=None,
    help="Launch distributed PyTorch training on this machine, many machines over SSH, or Slurm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"distlaunch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also print distlaunch's debug notices."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print only distlaunch's warnings and errors."),
) -> None:
    """Launch distributed PyTorch training on this machine, many machines over SSH, or Slurm."""
    notices.install(verbose=verbose, quiet=quiet)


def _given(exc: cx.UsageError, argv: list[str]) -> str:
    """', not 'VALUE'' for a bad option value: the message of a type or range check does not say what it got."""
    names = getattr(getattr(exc, "param", None), "opts", None) or []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name in names and (eq or i + 1 < len(argv)):
            return f" (got {value if eq else argv[i + 1]!r})"
    return ""


def _error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def _private_dir() -> str:
    """``$TMPDIR/distlaunch-<uid>``, mode 0700, when it is a real directory of ours that nobody else can
    write into; else a fresh ``mkdtemp`` folder (random name, 0700)."""
    base = os.path.join(tempfile.gettempdir(), f"distlaunch-{os.getuid()}")
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="distlaunch-debug-")
    info = os.lstat(base)  # lstat: a planted symlink is not followed, and fails the check below
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return tempfile.mkdtemp(prefix="distlaunch-debug-")
    return base


def write_debug_log(text: str) -> str:
    """Write ``text`` to a new file in a private folder (O_EXCL|O_NOFOLLOW, mode 0600); returns its path."""
    name = f"debug-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}.log"
    path = os.path.join(_private_dir(), name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        os.unlink(path)  # no empty log to puzzle over: the caller says it could not be written
        raise
    return path


def _internal_error(exc: BaseException) -> int:
    try:
        where = f"the traceback is in {write_debug_log(''.join(traceback.format_exception(exc)))}"
    except OSError as err:  # a full or read-only temporary folder: the error is still one line, and says where
        frames = traceback.extract_tb(exc.__traceback__)
        at = f"it was raised at {frames[-1].filename}:{frames[-1].lineno}; " if frames else ""
        where = f"{at}its traceback could not be written in {tempfile.gettempdir()}: {err.strerror or err}"
    _error(f"internal error: {type(exc).__name__}: {exc} (hint: this is a distlaunch bug; {where})")
    return ExitCode.CHECK_FAILED


def _closed_pipe() -> int:
    """The reader of stdout or stderr went away (``| head``): end quietly with SIGPIPE's status, as coreutils do."""
    drop_unread_output()
    return ExitCode.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code; user errors are one line, never a traceback. A signal at any
    moment ends it with 128 + the signal and one line (``distlaunch/interrupts.py``)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = _run(args, argv)
        try:
            sys.stdout.flush()  # a reader that left early is found here, not in the interpreter's last flush
        except BrokenPipeError:
            code = _closed_pipe()
    except Interrupted as stop:  # after the command's own work: its output is out
        code = _interrupted(stop.signum, args)
    final = interrupts.exit_code(code)
    if final != code:  # a signal came that nothing answered for: it was swallowed on the way, or came last
        _interrupted(final - 128, args)
    return final


def _interrupted(signum: int, args: list[str]) -> int:
    """The one line of a command that a signal stopped; its exit code."""
    interrupts.answer()
    words = [a for a in args[:2] if not a.startswith("-")][: 2 if args[:1] == ["data"] else 1]
    what = f"distlaunch {' '.join(words)}".strip()
    sys.stderr.write(f"{what}: interrupted by {signal.Signals(signum).name}\n")
    return 128 + signum


def _run(args: list[str], argv: list[str] | None) -> int:
    try:
        check_peer_spellings(args)
        result = app(args=argv, prog_name="distlaunch", standalone_mode=False)
    except (BrokenPipeError, SystemExit) as exc:  # typer and rich end a closed pipe with a silent exit 1
        if reader_gone(exc):
            return _closed_pipe()
        raise
    except DistlaunchError as exc:
        _error(str(exc))
        return exc.exit_code
    except cx.NoArgsIsHelpError:
        return 0  # typer has printed the help already
    except cx.NoSuchOption as exc:
        where = exc.ctx.command_path if exc.ctx else "distlaunch"
        named = trainer_flag(exc.option_name, args) if exc.ctx and exc.ctx.info_name == "train" else None
        _error(named or peer_equivalent(exc.option_name, where))
        return ExitCode.USAGE
    except cx.UsageError as exc:
        where = f" '{exc.ctx.command_path} --help'" if exc.ctx else " 'distlaunch --help'"
        _error(f"{exc.format_message()}{_given(exc, args)} (hint: see{where})")
        return ExitCode.USAGE
    except cx.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return ExitCode.SIGINT
    except KeyboardInterrupt:
        return ExitCode.SIGINT
    except Interrupted as exc:  # a signal that unwound the command: what it made was removed on the way
        return _interrupted(exc.signum, args)
    except Exception as exc:
        signum = interrupts.unanswered()
        if signum is not None:  # a signal's exception, turned into another by the code it landed in
            return _interrupted(signum, args)
        return _internal_error(exc)
    return result if isinstance(result, int) else 0

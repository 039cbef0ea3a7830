"""The ``distlaunch`` command. ``main`` is the one place where errors become messages and exit codes."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback

import typer

from distlaunch import __version__
from distlaunch.cli.doctor import doctor
from distlaunch.cli.run import run
from distlaunch.cli.checkpoint import checkpoint_app
from distlaunch.cli.slurm import slurm_app
from distlaunch.cli.train import train
from distlaunch.errors import DistlaunchError, ExitCode

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as cx

app = typer.Typer(
    name="distlaunch",
    help="Launch distributed PyTorch training on this machine, many machines over SSH, or Slurm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Everything after SCRIPT belongs to the script, as with torchrun and python itself.
_SCRIPT_CONTEXT = {"allow_interspersed_args": False}
app.command("run", context_settings=_SCRIPT_CONTEXT)(run)
app.command("doctor")(doctor)
app.command("train")(train)
app.add_typer(slurm_app)
app.add_typer(checkpoint_app)


def _version(value: bool) -> None:
    if value:
        print(f"distlaunch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")) -> None:
    """Launch distributed PyTorch training on this machine, many machines over SSH, or Slurm."""


def _error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def _internal_error(exc: BaseException) -> int:
    path = os.path.join(tempfile.gettempdir(), f"distlaunch-debug-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(exc)))
    _error(f"internal error: {type(exc).__name__}: {exc} (hint: this is a distlaunch bug; the traceback is in {path})")
    return ExitCode.CHECK_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code; user errors are one line, never a traceback."""
    try:
        result = app(args=argv, prog_name="distlaunch", standalone_mode=False)
    except DistlaunchError as exc:
        _error(str(exc))
        return exc.exit_code
    except cx.NoArgsIsHelpError:
        return 0  # typer has printed the help already
    except cx.UsageError as exc:
        where = f" '{exc.ctx.command_path} --help'" if exc.ctx else " 'distlaunch --help'"
        _error(f"{exc.format_message()} (hint: see{where})")
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
    except Exception as exc:  # noqa: BLE001 - the last line of defence: short message, traceback to a file
        return _internal_error(exc)
    return result if isinstance(result, int) else 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())

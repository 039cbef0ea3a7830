"""``distlaunch data prepare``: tokenize text or JSONL into memory-mapped shards for ``distlaunch train``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from distlaunch import interrupts
from distlaunch.cli.options import user_path
from distlaunch.cli.render import print_json
from distlaunch.data.prepare import DEFAULT_SHARD_TOKENS, PrepareReport, PrepareSpec, prepare
from distlaunch.data.verify import verify_dataset
from distlaunch.errors import DistlaunchError, Interrupted
from distlaunch.readable import plural

data_app = typer.Typer(
    name="data",
    no_args_is_help=True,
    help="Prepare datasets for distlaunch train, and verify a copy (docs/data.md).",
)


def render_prepare(report: PrepareReport, console: Console) -> None:
    """The tokenizer, the totals and one row per shard."""
    index = report.index
    console.print(
        f"[bold]{report.out}[/bold]: {plural(index.documents, 'document', grouped=True)}, {plural(index.tokens, 'token', grouped=True)} ({index.dtype})"
    )
    console.print(
        f"tokenizer {index.tokenizer.name}: vocabulary {index.vocab_size:,} "
        f"(the model pads it to {report.padded_vocab_size:,}), end-of-text id {index.tokenizer.eos_id}"
    )
    table = Table()
    for col in ("shard", "tokens", "documents"):
        table.add_column(col, justify="left" if col == "shard" else "right")
    for shard in index.shards:
        table.add_row(shard.file, f"{shard.tokens:,}", f"{shard.documents:,}")
    console.print(table)
    console.print(f"train on it: distlaunch train --set data.path={report.out}")


@data_app.command("prepare")
def prepare_command(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Text files (one document each) or JSONL files (one document per line)."),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            help="Folder to write the shards, index and tokenizer to: new, empty, or a prepared dataset.",
        ),
    ],
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            "-t",
            metavar="TOKENIZER",
            help="bpe:VOCAB (train a byte-level BPE on the inputs), PATH/tokenizer.json, PATH.tiktoken, "
            "or gpt2 (tiktoken's file, from its cache; never downloaded).",
        ),
    ],
    field: Annotated[
        str, typer.Option("--field", metavar="NAME", help="The JSONL field that holds the text.")
    ] = "text",
    shard_tokens: Annotated[
        int, typer.Option("--shard-tokens", help="Start a new shard past this many tokens.")
    ] = DEFAULT_SHARD_TOKENS,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> int:
    """Tokenize INPUTS (text or JSONL files) into memory-mapped token shards, an index.json and the tokenizer, in --out."""
    spec = PrepareSpec(inputs=inputs, out=out, tokenizer=tokenizer, field=field, shard_tokens=shard_tokens)
    status = Console(stderr=True)
    # Ctrl-C, SIGTERM or a closed terminal unwind the prepare, which removes its unfinished folder
    try:
        if status.is_terminal:  # a live line on the terminal only: logs and pipes get just the result
            with status.status("preparing") as line:
                report = prepare(spec, progress=line.update)
        else:
            report = prepare(spec)
    except Interrupted as stop:
        interrupts.answer()
        raise DistlaunchError(f"interrupted by {stop.name}; {out} unchanged", exit_code=stop.exit_code) from None
    print_json(report) if json_output else render_prepare(report, Console())
    return 0


@data_app.command("verify")
def verify_command(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="A folder written by distlaunch data prepare.",
            parser=user_path("DIR", "a folder written by distlaunch data prepare", required=True),
        ),
    ],
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> int:
    """Check every shard against the size and SHA-256 recorded at prepare; exit 0 intact, 1 damaged, 2 no dataset."""
    report = verify_dataset(folder)
    if json_output:
        print_json(report)
        return 0 if report.ok else 1
    console = Console(highlight=False, soft_wrap=True)
    for problem in report.problems:
        console.print(f"[red]damaged[/red] {problem}")
    if report.ok:
        console.print(
            f"[green]ok[/green] {report.folder} ({plural(report.shards, 'shard')}, {plural(report.tokens, 'token', grouped=True)}, "
            f"{report.bytes / 2**20:.1f} MiB)"
            + ("" if report.verified == report.shards else "; checked as a whole (prepared before per-shard checksums)")
        )
    return 0 if report.ok else 1

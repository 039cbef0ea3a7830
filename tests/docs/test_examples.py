"""What the docs show is what distlaunch does: their console examples run, their JSON examples parse into the
real models with the real keys. A change that makes an example false fails here (tests/docs/examples.py says
how a page marks what runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.examples import DOCS, ROOT, Block, commands, json_of, matches, normalise, read_page

PAGES = {path.relative_to(ROOT).as_posix(): read_page(path) for path in DOCS}
RUNNABLE = sorted(name for name, page in PAGES.items() if any(b.not_run is None for b in page.of("console")))
_ID = re.compile(r"\bdl-[0-9a-f]{12}\b")
_ID_PREFIX = re.compile(r"\bdl-[0-9a-f]{3,12}\b")


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # the distlaunch command of this interpreter comes first
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "DISTLAUNCH_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "200",  # no table cell wraps, whatever the interpreter's path (the page's padding is not compared)
        "NO_COLOR": "1",
        "TERM": "dumb",
    }


def _workdir(tmp_path: Path) -> Path:
    """A folder like a clean clone's root as a reader's shell sees it: the shipped hostfiles and templates."""
    work = tmp_path / "work"
    work.mkdir()
    for shipped in ("hostfiles", "templates"):
        (work / shipped).symlink_to(ROOT / shipped)
    return work


def _with_ids(command: str, ids: dict[str, str]) -> str:
    """A job id the page shows (or a prefix of one, as users type it) replaced by the real job's."""

    def real(found: re.Match) -> str:
        shown = found.group(0)
        full = next((page for page in ids if page.startswith(shown)), None)
        return ids[full][: len(shown)] if full else shown

    return _ID_PREFIX.sub(real, command)


def _fail(block: Block, name: str, command: str, expected: list[str], actual: list[str]) -> str:
    return (
        f"{name}:{block.line}: '$ {command}' printed what the page does not show.\n"
        + "--- the page (normalised)\n"
        + "\n".join(expected)
        + "\n--- distlaunch (normalised)\n"
        + "\n".join(actual)
    )


@pytest.mark.parametrize("name", RUNNABLE)
def test_console_examples_print_what_the_page_shows(name, tmp_path):
    """Every console block of the page that is not marked otherwise, in order, in one working folder."""
    work, env, ids = _workdir(tmp_path), _env(tmp_path), {}
    for block in PAGES[name].of("console"):
        if block.not_run is not None:
            continue
        for step in commands(block):
            command = _with_ids(step.command, ids)
            done = subprocess.run(
                ["bash", "-c", command], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=300,
            )  # fmt: skip
            ids.update(zip(_ID.findall("\n".join(step.expected)), _ID.findall(done.stdout), strict=False))
            expected, actual = normalise("\n".join(step.expected)), normalise(done.stdout, str(work))
            assert matches(expected, actual), _fail(block, name, command, expected, actual)


def test_a_console_block_not_run_here_says_why():
    """A block is run unless a comment right above it gives the reason; a reason with no block after it is
    a mistake (the comment moved away from its block)."""
    for name, page in PAGES.items():
        for block in page.of("console"):
            assert block.not_run is None or len(block.not_run) > 10, f"{name}:{block.line}: give the reason"
        stray = [b for b in page.blocks if b.not_run is not None and b.language != "console"]
        assert not stray, f"{name}:{stray[0].line}: 'not run' stands above a {stray[0].language or 'plain'} block"


_NAMED_TEST = re.compile(r"\b(tests/[\w/]+\.py)::(test_\w+)")


def test_a_console_example_not_run_here_names_the_tests_that_run_its_steps():
    """A console example (a block of ``$ COMMAND`` lines and what they print) runs here, or its comment names
    the test that does its steps for real, as ``tests/PATH.py::test_NAME`` (each one named must exist). A
    block of ``$`` lines in another language is one too: it is marked ``console``, and so run or named."""
    for name, page in PAGES.items():
        for block in page.blocks:
            transcript = any(line.startswith("$ ") for line in block.text.splitlines())
            if not transcript and block.language != "console":
                continue
            assert block.language == "console", f"{name}:{block.line}: a block of '$ COMMAND' lines is a console block"
            if block.not_run is None:
                continue  # it runs: test_console_examples_print_what_the_page_shows
            named = _NAMED_TEST.findall(block.not_run)
            assert named, f"{name}:{block.line}: name the test that runs these steps (tests/PATH.py::test_NAME)"
            for path, test in named:
                source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
                assert re.search(rf"^def {test}\(", source, re.M), f"{name}:{block.line}: {path}::{test} does not exist"


def _keys(data: object) -> set[str]:
    """Every key path of a JSON value (lists: their first item stands for every item)."""
    if isinstance(data, dict):
        return {k for key, value in data.items() for k in {key} | {f"{key}.{sub}" for sub in _keys(value)}}
    if isinstance(data, list) and data:
        return _keys(data[0])
    return set()


def _json_block(name: str, marker: str) -> Block:
    found = [b for b in PAGES[name].blocks if b.language in ("json", "jsonc") and marker in b.text]
    assert len(found) == 1, f"{name}: one JSON block holding {marker!r}, found {len(found)}"
    return found[0]


def test_the_run_report_example_is_a_run_report():
    from distlaunch.contract.report import RunReport

    shown = json_of(_json_block("docs/cli.md", '"failures"'))
    report = RunReport.model_validate(shown)
    assert _keys(shown) == _keys(report.model_dump(mode="json")), "docs/cli.md: the report's keys"


def test_the_plan_schema_example_is_a_dry_runs_plan(tmp_path):
    """plan.md's schema (jsonc) against a real --dry-run --json of the same job: the same keys everywhere."""
    from distlaunch.launcher.planning.plan import LaunchPlan

    shown = json_of(_json_block("docs/plan.md", '"groups"'))
    shown["nodes"][0]["ranks"][0]["env"].pop("...")
    LaunchPlan.model_validate(shown)
    real = subprocess.run(
        ["distlaunch", "run", "-H", str(ROOT / "hostfiles" / "deepspeed.txt"), "--parallel", "dp=2,tp=2,pp=2,zero=1",
         "--dry-run", "--json", "train.py"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env(tmp_path),
    )  # fmt: skip
    assert real.returncode == 0, real.stderr
    plan = __import__("json").loads(real.stdout)
    env_keys = {k for k in _keys(plan) if ".env." in k}
    assert _keys(shown) == _keys(plan) - env_keys | {k for k in _keys(shown) if ".env." in k}
    assert shown["groups"] == plan["groups"] and shown["parallel"] == plan["parallel"]


def test_the_memory_example_is_a_dry_runs_memory_plan():
    from distlaunch.training.planner import MemoryPlan

    shown = json_of(_json_block("docs/train.md", '"memory"'))
    memory = MemoryPlan.model_validate(shown["memory"])
    assert _keys(shown["memory"]) == _keys(memory.model_dump(mode="json")), "docs/train.md: the memory keys"


def test_the_index_example_is_a_prepared_folders_index():
    from distlaunch.data.index import DatasetIndex

    shown = json_of(_json_block("docs/data.md", '"shards"'))
    index = DatasetIndex.model_validate(shown)
    dumped = index.model_dump(mode="json", exclude_none=True)
    assert _keys(shown) <= _keys(dumped), "docs/data.md: a key index.json does not have"


def test_the_meta_json_example_is_what_a_checkpoint_of_that_job_holds(tmp_path):
    """checkpointing.md's meta.json against a real checkpoint of the job it describes (tiny, dp=2, ZeRO-0):
    the same keys, and the same component counts and sizes (only times, hashes and shard bytes differ)."""
    from distlaunch.training.checkpoint.manifest import CheckpointMeta

    shown = json_of(_json_block("docs/checkpointing.md", '"components"'))
    for digest in shown["files"].values():  # the page shortens each SHA-256 to its first hex digits
        digest["sha256"] = digest["sha256"].ljust(64, "0")
    CheckpointMeta.model_validate(shown)
    done = subprocess.run(
        ["distlaunch", "train", "-n", "2", "--parallel", "dp=2,zero=0", "--set", "train.steps=2",
         "--set", "checkpoint.dir=ckpt", "--set", "train.eval_every=0"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    real = __import__("json").loads((tmp_path / "ckpt" / "step_000002" / "meta.json").read_text())
    assert _keys(shown) - {k for k in _keys(shown) if k.startswith("files.")} == _keys(real) - {
        k for k in _keys(real) if k.startswith("files.")
    }
    for key in ("format", "preset", "layout", "components", "extras"):
        assert shown[key] == real[key], f"docs/checkpointing.md meta.json: {key} is {real[key]!r}"
    assert shown["data"]["fingerprint"].split(":")[:2] == real["data"]["fingerprint"].split(":")[:2]
    assert sorted(shown["files"]) == sorted(real["files"])


_ROW = re.compile(r"^\| ((?:`[\w.]+`(?:, )?)+) \| ([^|]+) \|")
_SECTION = re.compile(r"^#+ .*\[(\w+)\]")
_NONE_WORDS = ("none", "derived", "auto", "world / (tp·pp)", "lr / 10", "the bundled corpus")  # None: decided later


def _config_rows() -> list[tuple[str, int, str, str]]:
    """(page, line, section.key, default as written) for every row of a config key table in the docs: keys
    written whole (``checkpoint.every``), or bare under a ``[section]`` heading."""
    from distlaunch.training.config import TrainingConfig

    rows = []
    for path in DOCS:
        section, header, previous = None, "", ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if heading := _SECTION.match(line):
                section = heading.group(1) if heading.group(1) in TrainingConfig.model_fields else None
            elif line.startswith("#"):
                section = None
            if line.startswith("|") and not previous.startswith("|"):
                header = line  # a table starts: only tables with a default column list defaults
            previous = line
            row = _ROW.match(line)
            if not row or line == header or "default" not in header.split("|")[2]:
                continue
            keys = [key.strip("`") for key in row.group(1).split(", ")]
            defaults = [d.strip() for d in row.group(2).split(", ")] if len(keys) > 1 else [row.group(2).strip()]
            for key, default in zip(keys, defaults * len(keys) if len(defaults) == 1 else defaults, strict=False):
                full = key if "." in key else f"{section}.{key}" if section else None
                if full and full.split(".")[0] in TrainingConfig.model_fields:
                    rows.append((path.relative_to(ROOT).as_posix(), number, full, default))
    return rows


def _reads_as(shown: str, value: object) -> bool:
    shown = shown.strip("`").strip()
    if value is None:
        return shown.startswith(_NONE_WORDS)
    if isinstance(value, bool):
        return shown == str(value).lower()
    if isinstance(value, (int, float)):
        return re.fullmatch(r"[\d.e+-]+", shown) is not None and float(shown) == value
    return shown == str(value)


def test_the_config_key_tables_give_the_real_defaults():
    """Every config key a docs table lists exists, with the default the table gives."""
    from distlaunch.training.config import TrainingConfig

    defaults = TrainingConfig()
    rows = _config_rows()
    assert len(rows) > 40, "the key tables were not found"  # train.md alone lists every key
    wrong = []
    for page, line, key, shown in rows:
        section, name = key.split(".")
        table = getattr(defaults, section)
        if name not in type(table).model_fields:
            wrong.append(f"{page}:{line}: {key} is not a config key")
        elif not _reads_as(shown, getattr(table, name)):
            wrong.append(f"{page}:{line}: {key} defaults to {getattr(table, name)!r}, the table says {shown!r}")
    assert not wrong, "\n".join(wrong)


def test_every_config_the_docs_name_or_show_loads():
    """A TOML block in the docs, and every shipped template a page names, is a config the engine takes."""
    import tomllib

    from distlaunch.training.config import TrainingConfig, load_config

    shown = [(name, b) for name, page in PAGES.items() for b in page.of("toml")]
    for _name, block in shown:  # a bad one raises, naming the key
        TrainingConfig.model_validate(tomllib.loads(block.text))
    named = {m for path in DOCS for m in re.findall(r"templates/[\w.-]+\.toml", path.read_text(encoding="utf-8"))}
    assert len(named) >= 3, named
    for template in sorted(named):
        assert (ROOT / template).is_file(), f"the docs name {template}, which is not shipped"
        load_config(ROOT / template, [])

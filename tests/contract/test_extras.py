"""The hint that installs an extra matches how distlaunch was installed: from a checkout (editable, as the README
installs it) it names that folder, since the package index holds no distlaunch; otherwise the package's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distlaunch import extras
from distlaunch.data import tokenizer
from distlaunch.errors import UsageError


class Metadata:
    """A distribution's metadata with only the file install_command reads."""

    def __init__(self, direct_url: dict | None):
        self.text = None if direct_url is None else json.dumps(direct_url)

    def read_text(self, name: str) -> str | None:
        return self.text if name == "direct_url.json" else None


def installed(monkeypatch, *found: Metadata) -> None:
    monkeypatch.setattr(extras.metadata, "distributions", lambda name: list(found))


def editable(folder: Path) -> Metadata:
    return Metadata({"url": folder.as_uri(), "dir_info": {"editable": True}})


def test_an_editable_install_names_its_checkout(monkeypatch):
    checkout = extras.PACKAGE.parent
    installed(monkeypatch, Metadata(None), editable(checkout))  # a checkout's .egg-info first: no direct_url.json
    assert extras.install_command("data") == f"pip install -e '{checkout}[data]'"


def test_a_checkout_folder_with_a_space_is_quoted_for_the_shell(monkeypatch, tmp_path):
    checkout = tmp_path / "my src"
    monkeypatch.setattr(extras, "PACKAGE", checkout / "distlaunch")
    installed(monkeypatch, editable(checkout))
    assert extras.install_command("plot") == f"pip install -e '{checkout}[plot]'"


@pytest.mark.parametrize(
    "found",
    [
        [],  # no metadata at all (run from a folder on PYTHONPATH)
        [Metadata(None)],  # a wheel from an index: no direct_url.json
        [Metadata({"url": "file:///tmp/distlaunch-0.1.0-py3-none-any.whl", "archive_info": {}})],
        [Metadata({"url": "file:///elsewhere", "dir_info": {}})],  # a folder, installed not editable
        [Metadata({"url": "https://example.com/distlaunch.git", "vcs_info": {"vcs": "git"}})],
    ],
)
def test_any_other_install_names_the_package(monkeypatch, found):
    installed(monkeypatch, *found)
    assert extras.install_command("data") == "pip install 'distlaunch[data]'"


def test_an_editable_install_of_another_checkout_is_not_this_one(monkeypatch, tmp_path):
    installed(monkeypatch, editable(tmp_path))  # the distlaunch that runs is not in that folder
    assert extras.install_command("track") == "pip install 'distlaunch[track]'"


def test_unreadable_metadata_gives_the_plain_hint(monkeypatch):
    broken = Metadata(None)
    broken.text = "{not json"
    installed(monkeypatch, broken)
    assert extras.install_command("data") == "pip install 'distlaunch[data]'"


def test_a_missing_tokenizer_package_says_how_to_install_the_data_extra(monkeypatch):
    installed(monkeypatch, editable(extras.PACKAGE.parent))
    with pytest.raises(UsageError) as err:
        tokenizer._require("distlaunch_no_such_module")
    assert err.value.hint == f"pip install -e '{extras.PACKAGE.parent}[data]'"

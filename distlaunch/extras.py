"""How to install one of distlaunch's extras (``data``, ``plot``, ``track``), said the way distlaunch itself was
installed. Standard library only: the engine, the data pipeline and the CLI all name it in their hints.

The README installs from a checkout (``pip install -e .``), and the package index holds no distlaunch: there,
``pip install 'distlaunch[data]'`` would ask the index for a project that is not on it. An editable install
records its source folder in the ``direct_url.json`` of its metadata (PEP 610), so the hint can name it.
"""

from __future__ import annotations

import json
import shlex
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

PACKAGE = Path(__file__).resolve().parent  # the distlaunch package that runs now


def install_command(extra: str) -> str:
    """``pip install -e '/src/distlaunch[data]'`` for an editable install from a checkout, else
    ``pip install 'distlaunch[data]'``."""
    folder = checkout()
    target = f"{folder}[{extra}]" if folder is not None else f"distlaunch[{extra}]"
    return f"pip install {'-e ' if folder is not None else ''}{shlex.quote(target)}"


def checkout() -> Path | None:
    """The source folder of an editable install of the distlaunch that runs now, None for any other install.

    Every distlaunch metadata on the path is looked at, not only the first: a checkout's own ``.egg-info``
    (found first when the current folder is the checkout) records no ``direct_url.json``."""
    for dist in metadata.distributions(name="distlaunch"):
        folder = _editable_folder(dist)
        if folder is not None and PACKAGE.is_relative_to(folder):  # that checkout is the code running now
            return folder
    return None


def _editable_folder(dist: metadata.Distribution) -> Path | None:
    try:
        record = json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):  # unreadable metadata: the plain hint, never a failed hint
        return None
    dir_info = record.get("dir_info") if isinstance(record, dict) else None
    if not isinstance(dir_info, dict) or dir_info.get("editable") is not True:
        return None
    url = urlparse(str(record.get("url", "")))
    if url.scheme != "file":
        return None
    return Path(url2pathname(url.path)).resolve()  # %20 -> a space

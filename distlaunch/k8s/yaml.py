"""A small YAML writer for manifests: plain dicts, lists, strings, numbers, booleans and None.

Every string is written double-quoted in JSON's escaping, which YAML reads the same way, so no value
(``"on"``, ``"0755"``, ``"$(VAR)"``, a ``: `` inside a command) changes meaning or type on the way.
"""

from __future__ import annotations

import json
import re

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
# what YAML does not take raw in a double-quoted string (besides what JSON already escapes)
_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]")


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return _escape_unprintable(json.dumps(str(value), ensure_ascii=False))


def _escape_unprintable(quoted: str) -> str:
    """JSON leaves DEL and the C1 controls (NEL, U+0085 …) raw, which YAML refuses or reads as a break:
    escape them as YAML reads them back."""
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m[0]):04x}", quoted)


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) else _escape_unprintable(json.dumps(key, ensure_ascii=False))


def _lines(value, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                out += [f"{pad}{_key(k)}:", *_lines(v, indent + 2)]
            else:
                out.append(f"{pad}{_key(k)}: {_block_empty(v)}")
        return out
    out = []
    for item in value:
        if isinstance(item, dict | list) and item:
            inner = _lines(item, indent + 2)
            out += [f"{pad}- {inner[0].lstrip()}", *inner[1:]]
        else:
            out.append(f"{pad}- {_block_empty(item)}")
    return out


def _block_empty(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def dump_all(documents: list[dict]) -> str:
    """The documents as one YAML stream, each opened by ``---``."""
    return "".join("---\n" + "\n".join(_lines(doc, 0)) + "\n" for doc in documents)

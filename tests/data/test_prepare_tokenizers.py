"""``distlaunch data prepare`` on tokenizers it must refuse: one line and exit 2, nothing written (the real CLI)."""

from __future__ import annotations

import pytest

from tests.data.conftest import assert_refused_case

BYTES = [bytes([b]) for b in range(256)]
# name -> (files to write, --tokenizer, what the one line says); "{tmp}" is the test's folder
CASES = {
    "tiktoken lacking bytes": (
        {"t.tiktoken": "YQ== 0\nYg== 1\n"},
        "{tmp}/t.tiktoken",
        "lacks 254 of the 256 single-byte tokens",
    ),
    "tiktoken repeating a token": (
        {"t.tiktoken": [*BYTES, b"ab", b"ab"]},
        "{tmp}/t.tiktoken",
        "t.tiktoken:258: token repeats line 257",
    ),
    "tiktoken repeating a rank": (
        {"t.tiktoken": ([*BYTES, b"ab"], [*range(256), 3])},
        "{tmp}/t.tiktoken",
        "t.tiktoken:257: rank repeats line 4",
    ),
    "word level without unk": (
        {"nounk.json": {"a": 0, "</s>": 1}},
        "{tmp}/nounk.json",
        "unknown-word token '[UNK]' is not in its vocabulary",
    ),
    "no end-of-text token": (
        {"noeos.json": {"a": 0, "[UNK]": 1}},
        "{tmp}/noeos.json",
        "has no end-of-text token (none of <|endoftext|>, </s>",
    ),
    "a folder as tokenizer": (
        {"tok/tokenizer.json": {"[UNK]": 0, "</s>": 1}},
        "{tmp}/tok",
        "--tokenizer {tmp}/tok is a folder (hint: pass the file: --tokenizer {tmp}/tok/tokenizer.json)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_tokenizer_prepare_cannot_use_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    assert_refused_case(tmp_path, *CASES[case])

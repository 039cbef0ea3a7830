"""Each parallel piece against the plain layer, on 2 real gloo ranks (see _pieces.py)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.engine import _pieces
from tests.engine.harness import spawn_ok

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def piece_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("pieces")
    spawn_ok([sys.executable, _pieces.__file__, str(out)], world_size=2, timeout=300)
    return [json.loads((out / f"pieces.rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("check", sorted(_pieces.CHECKS))
def test_piece_matches_plain_layer(check, piece_results):
    for rank, results in enumerate(piece_results):
        assert results[check] == "ok", f"rank {rank}:\n{results[check]}"

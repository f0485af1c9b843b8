"""Fixtures of the data tests (helpers: refdata.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from refdata import EDGE_LINES, tiny_synth


@pytest.fixture(scope="session")
def raw_small(tmp_path_factory) -> Path:
    """tiny_synth output (2% malformed lines) with the hand-written edge lines before (train) and
    after it (test), CRLF on some of them."""
    d = tmp_path_factory.mktemp("raw_small")
    tiny_synth(d, bad_line_rate=0.02)
    path = d / "day_0"
    extra = ("\n".join(t for t, _ in EDGE_LINES[:-1]) + "\n" + EDGE_LINES[-1][0] + "\r\n").encode()
    path.write_bytes(extra + path.read_bytes() + extra.replace(b"\n", b"\r\n"))
    (d / "oracle.json").unlink()  # not a synth output any more
    return d

"""criteo: block reading, hex parsing and the malformed-line policy."""

from __future__ import annotations

import gzip
import math
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dlrm_cache.data import criteo, rawtext
from dlrm_cache.data.format import MISSING_ID

from refdata import EDGE_LINES, GOOD


def test_parse_hex_vectorized() -> None:
    values = [
        b"0000000a",
        b"ffffffff",
        b"FFFFFFFE",
        b"1",
        b"abc",
        None,
        b"zz",
        b"123456789",
        b"0g000000",
        b"00000000",
        b"g",
    ]
    ids, bad = criteo.parse_hex(pa.array(values, pa.binary()))
    assert bad.tolist() == [False] * 6 + [True, True, True, False, True]
    assert ids[:6].tolist() == [10, 0xFFFFFFFF, 0xFFFFFFFE, 1, 0xABC, MISSING_ID]
    assert ids[9] == 0
    # All 8-digit values (the fast path), a sliced array, and an all-empty column.
    ids, bad = criteo.parse_hex(
        pa.array([b"deadbeef", None, b"0000000g", b"DEADBEEF"], pa.binary()).slice(1)
    )
    assert ids[0] == MISSING_ID and bad.tolist() == [False, True, False] and ids[2] == 0xDEADBEEF
    ids, bad = criteo.parse_hex(pa.array([None, None], pa.binary()))
    assert ids.tolist() == [MISSING_ID, MISSING_ID] and not bad.any()


def test_parse_block_policy() -> None:
    text = "\n".join(t for t, _ in EDGE_LINES)
    p = criteo.parse_block(text.encode(), first_line=100)
    expected_bad = [(100 + k, r) for k, (_, r) in enumerate(EDGE_LINES) if r]
    assert list(zip(p.bad_lines.tolist(), p.bad_reasons)) == expected_bad
    assert p.lines.tolist() == [100, 100 + len(EDGE_LINES) - 1]
    assert p.label.tolist() == [1.0, 0.0]
    # GOOD: I1=5, I2=-3 (clipped), I3 empty, I4=0, I5=99999999999.
    np.testing.assert_allclose(
        p.dense[:5, 0], [math.log1p(5), 0, 0, 0, math.log1p(99999999999)], rtol=1e-6
    )
    assert p.dense.dtype == np.float32 and np.isfinite(p.dense).all()
    assert p.ids[:6, 0].tolist() == [0xA, MISSING_ID, 0xABCDEF12, 0xF, 1, 0]
    assert p.ids.dtype == np.int64 and p.ids.shape == (26, 2)


@pytest.mark.parametrize(
    "line,reason",
    [
        (
            "",
            "wrong field count",
        ),  # only an empty line is wrong: no other line forces the slow path
        ("2" + GOOD[1:], "label not 0/1"),
        (GOOD.replace("\t5\t", "\tabc\t", 1), "non-integer in an integer field"),
        (GOOD.replace("0000000a", "xyz", 1), "categorical not 1-8 hex digits"),
    ],
)
def test_single_bad_line_among_good(line: str, reason: str) -> None:
    text = "\n".join([GOOD, line, GOOD]) + "\n"
    p = criteo.parse_block(text.encode())
    assert p.bad_lines.tolist() == [1] and p.bad_reasons == [reason]
    assert p.lines.tolist() == [0, 2]


def test_crlf_and_missing_final_newline() -> None:
    text = (GOOD + "\r\n" + GOOD + "\r\n" + GOOD).encode()
    p = criteo.parse_block(text)
    assert p.lines.tolist() == [0, 1, 2] and len(p.bad_lines) == 0
    # A CR inside a line is not a line end: that line is malformed.
    p = criteo.parse_block((GOOD.replace("\t5\t", "\t5\r\t", 1) + "\n" + GOOD + "\n").encode())
    assert p.bad_lines.tolist() == [0] and p.lines.tolist() == [1]


@pytest.mark.parametrize("gz", [False, True])
def test_blocks_number_lines_across_chunks(tmp_path: Path, gz: bool) -> None:
    lines = [GOOD.replace("0000000a", f"{k:08x}", 1) for k in range(300)]
    lines[137] = ""  # an empty line in the middle
    data = ("\r\n".join(lines)).encode()  # CRLF, no final newline
    path = tmp_path / ("x.gz" if gz else "x")  # gzip is detected by content, not name
    path.write_bytes(gzip.compress(data) if gz else data)
    assert rawtext.count_lines(path) == 300
    seen, bad = [], []
    for block, parsed in criteo.read_file(path, chunk_bytes=1000):
        assert block.data.endswith(b"\n") or block.first_line + block.num_lines == 300
        seen += parsed.lines.tolist()
        bad += parsed.bad_lines.tolist()
        assert (parsed.ids[0] == parsed.lines).all()  # line k has C1 = k
    assert seen == [k for k in range(300) if k != 137] and bad == [137]
    # Stopping early and resuming from a block end.
    blocks = list(rawtext.iter_blocks(path, 1000, stop_line=50))
    assert blocks[-1].first_line < 50 <= blocks[-1].first_line + blocks[-1].num_lines
    rest = list(
        rawtext.iter_blocks(
            path,
            1000,
            start=blocks[-1].end,
            start_line=blocks[-1].first_line + blocks[-1].num_lines,
        )
    )
    assert sum(b.num_lines for b in blocks + rest) == 300


def test_count_lines_edge_cases(tmp_path: Path) -> None:
    for data, n in [(b"", 0), (b"a", 1), (b"a\n", 1), (b"\n\n", 2), (b"a\nb", 2)]:
        (tmp_path / "f").write_bytes(data)
        assert rawtext.count_lines(tmp_path / "f") == n


# Values pyarrow's own int64 parser takes or refuses differently from the policy: a line's verdict
# must be the same whatever else its block holds (here: nothing else bad, or a bad line beside it).
BORDERLINE = [
    (GOOD.replace("\t5\t", "\t 5\t", 1), "non-integer in an integer field"),
    (GOOD.replace("\t5\t", "\t5 \t", 1), "non-integer in an integer field"),
    (GOOD.replace("\t5\t", "\t0x5\t", 1), "non-integer in an integer field"),
    (
        GOOD.replace("\t5\t", "\t9223372036854775808\t", 1),
        "non-integer in an integer field",
    ),  # int64 max + 1
    (GOOD.replace("\t5\t", "\t9223372036854775807\t", 1), None),  # int64 max
    (GOOD.replace("\t5\t", "\t-9223372036854775808\t", 1), None),  # int64 min
    (GOOD.replace("\t5\t", "\t-0000000000000000000000005\t", 1), None),
]


@pytest.mark.parametrize("line,reason", BORDERLINE)
@pytest.mark.parametrize("neighbour", [GOOD, GOOD.replace("\t5\t", "\tx\t", 1)])
def test_acceptance_is_a_property_of_the_line(
    line: str, reason: str | None, neighbour: str
) -> None:
    p = criteo.parse_block("\n".join([GOOD, line, neighbour]).encode())
    verdict = dict(zip(p.bad_lines.tolist(), p.bad_reasons))
    assert verdict.get(1) == reason
    assert (1 in p.lines.tolist()) == (reason is None)


def test_pyarrow_int64_parser_is_the_policy_on_plain_bytes() -> None:
    """The fast path's premise (criteo._plain): on the bytes of valid lines, pyarrow's own int64
    conversion accepts exactly an optional '-' and digits that fit in int64, with their value."""
    rng = random.Random(0)
    alphabet = "0123456789abcdefABCDEF-"
    values = {
        "".join(
            rng.choice(alphabet) if rng.random() < 0.3 else rng.choice("0123456789")
            for _ in range(rng.randint(1, 22))
        )
        for _ in range(600)
    }
    values |= {
        "-",
        "--1",
        "1-",
        "-0",
        "007",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "0" * 30 + "5",
        "1e5",
        "0b1",
    }
    lines = [GOOD.replace("\t5\t", f"\t{v}\t", 1) for v in sorted(values)]
    data = "\n".join(lines).encode()
    fast = criteo.parse_block(data)  # typed where pyarrow converts the block, else per value
    for k, v in enumerate(sorted(values)):
        one = criteo.parse_block(lines[k].encode() + b"\n")
        ok = re.fullmatch(r"-?[0-9]+", v) is not None and -(2**63) <= int(v) < 2**63
        assert (len(one.lines) == 1) == ok, v
        if ok:
            assert one.dense[0, 0] == np.float32(np.log1p(max(int(v), 0))), v
    assert len(fast.lines) == sum(
        re.fullmatch(r"-?[0-9]+", v) is not None and -(2**63) <= int(v) < 2**63 for v in values
    )


def test_any_bytes_are_a_bad_line_not_a_crash() -> None:
    odd = [
        (
            GOOD.replace("\t5\t", "\t\xff5\t", 1).encode("latin-1"),
            "non-integer in an integer field",
        ),
        (b"\xff\xfe\x00junk\t1\t2", "wrong field count"),  # non-UTF-8 *and* the wrong field count
        (
            GOOD.replace("0000000a", "0000\x00\x00\xe9a", 1).encode("latin-1"),
            "categorical not 1-8 hex digits",
        ),
        (b"\x00" * 50, "wrong field count"),
        ("\xe9".encode("latin-1") + GOOD.encode()[1:], "label not 0/1"),
    ]
    data = b"\n".join([GOOD.encode(), *(o for o, _ in odd), GOOD.encode()]) + b"\n"
    p = criteo.parse_block(data)
    assert p.lines.tolist() == [0, len(odd) + 1]
    assert list(zip(p.bad_lines.tolist(), p.bad_reasons)) == [
        (k + 1, r) for k, (_, r) in enumerate(odd)
    ]


@pytest.mark.parametrize("chunk_bytes", [100, 4096, 1 << 20])
def test_over_long_line_is_skipped_and_never_held_whole(tmp_path: Path, chunk_bytes: int) -> None:
    huge = b"1\t" + b"7" * (10 << 20)  # a 10 MB line: too long for pyarrow's blocks too
    wide = GOOD.replace(
        "0000000a", "a" * (rawtext.MAX_LINE_BYTES + 1), 1
    ).encode()  # 40 fields, too long
    lines = [
        GOOD.encode(),
        huge,
        GOOD.encode(),
        wide,
        GOOD.encode(),
        huge,
    ]  # the last without newline
    (tmp_path / "f").write_bytes(b"\n".join(lines))
    assert rawtext.count_lines(tmp_path / "f") == 6
    good, bad, biggest = [], [], 0
    for block, parsed in criteo.read_file(tmp_path / "f", chunk_bytes):
        good += parsed.lines.tolist()
        bad += list(zip(parsed.bad_lines.tolist(), parsed.bad_reasons))
        biggest = max(biggest, len(block.data))
    assert good == [0, 2, 4]
    assert bad == [(1, "line too long"), (3, "line too long"), (5, "line too long")]
    if chunk_bytes < 4096:  # a long line ends every block: it is cut, not read whole
        assert biggest <= chunk_bytes + rawtext.MAX_LINE_BYTES + 3


def test_line_ends_and_byte_order_mark() -> None:
    p = criteo.parse_block(b"\xef\xbb\xbf" + (GOOD + "\r\n" + GOOD + "\r\n").encode())
    assert p.lines.tolist() == [0, 1] and len(p.bad_lines) == 0
    # Only at the start of a file: elsewhere the mark is part of the label field.
    p = criteo.parse_block(b"\xef\xbb\xbf" + GOOD.encode(), first_line=5)
    assert p.bad_reasons == ["label not 0/1"]


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_gzip_names_the_file(tmp_path: Path, damage: str) -> None:
    data = gzip.compress(("\n".join([GOOD] * 5000) + "\n").encode())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = data[:20] + bytes(b ^ 0x5A for b in data[20:200]) + data[200:]
    path = tmp_path / "day_0.gz"
    path.write_bytes(data)
    with pytest.raises(rawtext.InputError, match=f"{path}: truncated or corrupt gzip"):
        rawtext.count_lines(path)
    with pytest.raises(rawtext.InputError, match=f"{path}: truncated or corrupt gzip"):
        list(criteo.read_file(path, 1 << 12))

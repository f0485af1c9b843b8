"""`dlrm-cache verify` finds what `train` and `predict` would refuse (issue 27, target 4): each
planted defect is named in one line, exit status 1 (before: "ok" for every one of them), by the
same check `train` runs (its message, word for word, where train reads that file)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_integrity import cli, one_line, train_args  # noqa: E402

from dlrm_cache.data.parquet import read_parquet, write_parquet  # noqa: E402
from dlrm_cache.data.stats import COUNTS  # noqa: E402
from dlrm_cache.files.atomic import sha256_file


def _manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(ds: Path) -> None:
        m = json.loads((ds / "manifest.json").read_text())
        change(m)
        (ds / "manifest.json").write_text(json.dumps(m))

    return edit


def _bigger_table(m: dict) -> None:
    m["table_sizes"][2] += 1


def _no_digest(m: dict) -> None:
    m["stats_digest"] = "none"


def _shard_thrice(m: dict) -> None:
    t = m["splits"]["train"]
    t["shards"] += [t["shards"][0]] * 2
    t["shard_rows"] += [t["shard_rows"][0]] * 2
    t["rows"] = sum(t["shard_rows"])


def _train_shard_in_val(m: dict) -> None:
    t, v = m["splits"]["train"], m["splits"]["val"]
    v["shards"].append(t["shards"][1])
    v["shard_rows"].append(t["shard_rows"][1])
    v["rows"] = sum(v["shard_rows"])


def _counts_out_of_rank_order(ds: Path) -> None:
    """The statistics rewritten (a valid, checksummed file) with C1's two first counts swapped,
    the manifest's digest updated: every size agrees, the ranking does not."""
    t = read_parquet(ds / COUNTS)
    counts = t.column("count").to_numpy().copy()
    counts[[0, 1]] = counts[[1, 0]] + [0, 1]  # the second row now counts more than the first
    t = t.set_column(t.schema.get_field_index("count"), "count", pa.array(counts))
    write_parquet(t, ds / COUNTS)
    _manifest(lambda m: m.update(stats_digest=sha256_file(ds / COUNTS)))(ds)


DEFECTS = {
    "table_sizes unlike the statistics": (
        _manifest(_bigger_table),
        "stats/summary.json: table sizes",
        "are not the table_sizes of",
    ),
    "stats_digest none over statistics": (
        _manifest(_no_digest),
        "stats/counts.parquet: present, but",
        "records no statistics (stats_digest none)",
    ),
    "a shard listed three times": (
        _manifest(_shard_thrice),
        "manifest.json: not a dataset manifest (shard 'train/part-00000.parquet' is listed twice "
        "in splits.train)",
    ),
    "a training shard also a validation shard": (
        _manifest(_train_shard_in_val),
        "manifest.json: not a dataset manifest (shard 'train/part-00001.parquet' is listed in "
        "splits.train and splits.val)",
    ),
    # issue 38 target 7: before, "ok", and raw and processed predictions of one line then differed
    "hash_modulus edited after the build": (
        _manifest(lambda m: m.update(hash_modulus=100)),
        "manifest.json: hash_modulus 100, but",
        "preprocess.json records 0, which the dataset was built with",
    ),
    "statistics out of rank order": (
        _counts_out_of_rank_order,
        "stats/counts.parquet: table C1's ids are repeated or not in count order",
    ),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_verify_names_each_planted_defect(processed_synth: Path, tmp_path: Path, defect: str):
    ds = tmp_path / "ds"
    shutil.copytree(processed_synth, ds)
    assert cli("verify", str(ds), cwd=tmp_path)[0] == 0
    plant, *says = DEFECTS[defect]
    plant(ds)
    code, err = cli("verify", str(ds), cwd=tmp_path)
    assert code == 1, err
    named = [ln for ln in err.splitlines() if str(ds) in ln and all(s in ln for s in says)]
    assert len(named) == 1, err
    if defect == "table_sizes unlike the statistics":  # train's own check, the same words
        one_line(
            *cli(*train_args(ds, tmp_path / "run", "embedding=freq_cache"), cwd=tmp_path),
            "train",
            named[0].split(": ", 1)[1],
        )

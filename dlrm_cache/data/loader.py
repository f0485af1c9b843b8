"""Parquet shards -> batches of torchrec inputs, decoded ahead of time by a background thread.

Batches are slices of one deterministic stream: the split's shards in a (per-epoch shuffled)
order, each shard's rows (per-epoch shuffled) concatenated.  Global batch ``k`` is stream rows
``[k*B, (k+1)*B)``, and under torchrun rank ``r`` of ``W`` takes the ``r``-th ``B/W`` rows of it, so
the global batch does not depend on the number of ranks, and resuming at step ``s`` only needs the
stream position ``s*B`` (whole shards before it are skipped unread).

Everything stays columnar, as parquet stores it and as a KeyedJaggedTensor wants it (feature-major:
a feature's ids over a batch are a slice of one column).  A shard is shuffled with one gather per
column over the whole shard (a column of 250k ids stays in cache, per-batch gathers would miss it),
and a batch is then one copy per tensor of contiguous column slices, written straight into pinned
memory when the batches go to a GPU.  Every sample has exactly one id per feature, so the KJT's
lengths and offsets depend only on the batch size: :class:`~.batch.OneIdPerSample` builds them once.
A multi-hot dataset (``Manifest.multi_hot``) keeps every feature as a jagged column instead
(:mod:`.lists`; a one-hot feature's lists have length 1): a batch's KJT has int32 lengths
``[F*b]``, offsets of the ids' dtype and its per-key lengths known on the host
(:class:`~dlrm_cache.embedding.jagged.JaggedLayout` moves it), built with numpy, no loop per sample.

Under sharded embeddings (torchrun, parallel/sharded.py) a rank's batch holds its rows' dense
features and labels, but its own shards' ids over the *whole* global batch (every rank decodes the
whole batch anyway): :class:`~dlrm_cache.parallel.owned.OwnedShards`.  A batch moves itself to the
device (:meth:`~.batch.Batch.to`), so the pipeline does not depend on which of the two it holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..embedding.jagged import JaggedLayout, assemble
from ..parallel.owned import OwnedShards, rank_rows
from ..parallel.placement import Shard
from .batch import Batch, OneIdPerSample, SparseLayout
from .format import LABEL, Manifest
from .idrange import check_ids
from .lists import Lists, concat_columns, read_lists
from .parquet import open_parquet, read_errors
from .unchanged import DatasetFiles

# shards read and shuffled ahead of the one being sliced, each on its own thread
READ_AHEAD = 2


@dataclass
class _Columns:
    """Rows of one shard in stream order, columnar: what batches are sliced from."""

    labels: np.ndarray  # [n] float32
    dense: np.ndarray  # [num_dense, n] float32
    # [num_sparse, n] int32 (int64 if a table has more rows than int32 holds); a multi-hot
    # dataset's: jagged columns of that dtype
    ids: np.ndarray | Lists
    shard: str = ""  # the shard they came from (its path in the dataset)

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, lo: int, hi: int) -> _Columns:
        ids = self.ids.rows(lo, hi) if isinstance(self.ids, Lists) else self.ids[:, lo:hi]
        return _Columns(self.labels[lo:hi], self.dense[:, lo:hi], ids, self.shard)


def batches_per_epoch(rows: int, batch_size: int, drop_last: bool) -> int:
    """Global batches of ``batch_size`` over ``rows``: the last partial one dropped or kept."""
    full, rest = divmod(rows, batch_size)
    return full + (1 if rest and not drop_last else 0)


def check_batch_split(
    batch_size: int, world_size: int, key: str = "data.batch_size", exact: bool = True
) -> None:
    """Training batches split ``exact``ly over the ranks (every rank the same size, so the global
    batch is the same for any rank count); evaluation batches may split unevenly."""
    if batch_size <= 0 or (exact and batch_size % world_size):
        raise ValueError(
            f"{key}={batch_size}: must be a positive multiple of the number of ranks ({world_size})"
        )


class ShardStream:
    """Deterministic, restartable batch stream over one split of a processed dataset."""

    def __init__(
        self,
        root: str | Path,
        manifest: Manifest,
        split: str,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        key: str = "data.batch_size",
        pin: bool = False,
        shards: list[Shard] | None = None,
    ) -> None:
        """``shards``: this rank's embedding shards when the tables are sharded over the ranks
        (parallel/placement.py): a batch's ids are then those shards' ids over the whole global batch
        (:class:`OwnedShards`); ``None``: every feature's ids of this rank's rows."""
        if split not in manifest.splits:
            raise ValueError(
                f"{root}: the dataset has no '{split}' split (has {sorted(manifest.splits)})"
            )
        check_batch_split(batch_size, world_size, key, exact=drop_last)
        self.root = Path(root)
        self.info = manifest.splits[split]
        self.files = DatasetFiles(self.root, manifest, split)  # checked at every shard read
        self.table_sizes = manifest.table_sizes
        self.split = split
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.pin = pin  # batches in pinned memory (a GPU copies them asynchronously)
        self.keys = list(manifest.sparse_names)
        self.dense_names = list(manifest.dense_names)
        self.multi_hot = list(manifest.multi_hot)  # empty: one id per sample, the fast path
        self.one_id = OneIdPerSample(self.keys)
        self.jagged = JaggedLayout(self.keys)
        self.owned = None if shards is None else OwnedShards(self.keys, shards)
        self.layout: SparseLayout = (
            self.owned
            if self.owned is not None
            else (self.jagged if self.multi_hot else self.one_id)
        )  # how this stream's batches travel
        self.id_dtype = (
            torch.int32 if max(self.table_sizes) <= np.iinfo(np.int32).max else torch.int64
        )
        self.np_ids = np.dtype(np.int32 if self.id_dtype == torch.int32 else np.int64)

    def __len__(self) -> int:
        """Global batches per epoch."""
        return batches_per_epoch(self.info.rows, self.batch_size, self.drop_last)

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.info.shards)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch, 0xD1]).permutation(n)

    def _load(self, idx: int, epoch: int, skip: int) -> _Columns:
        """Shard ``idx`` in stream order (permuted when shuffling: one gather per column), from
        row ``skip`` on."""
        path = self.root / self.info.shards[idx]
        shard = open_parquet(path)  # every page checked against its CRC as it is read
        missing = [
            c for c in (LABEL, *self.dense_names, *self.keys) if c not in shard.schema_arrow.names
        ]
        if missing:
            raise ValueError(f"{path}: missing column '{missing[0]}'; preprocess the data again")
        with read_errors(path):
            table = shard.read()  # one chunk per column: to_numpy() below copies nothing
        self.files.check(self.info.shards[idx])  # still the dataset the stream started with
        n = table.num_rows
        perm = (
            np.random.default_rng([self.seed, epoch, idx]).permutation(n) if self.shuffle else None
        )

        def gather(names: list[str], dtype: np.dtype) -> np.ndarray:
            out = np.empty((len(names), n), dtype)
            for j, name in enumerate(names):
                col = table.column(name).to_numpy()
                if perm is None:
                    out[j] = col
                else:
                    np.take(
                        col, perm, out=out[j]
                    )  # a whole column stays in cache; per batch it would not
            return out

        check_ids(table, path, self.keys, self.table_sizes, self.multi_hot)
        ids: np.ndarray | Lists
        if self.multi_hot:
            ids = read_lists(table, self.keys, set(self.multi_hot), perm, self.np_ids)
        else:
            ids = gather(self.keys, self.np_ids)
        dense = gather(self.dense_names, np.dtype(np.float32))
        labels = gather([LABEL], np.dtype(np.float32))[0]
        return _Columns(labels, dense, ids, self.info.shards[idx]).rows(skip, n)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """This rank's part of global batches ``start, start+1, ...`` of ``epoch``.

        The next ``READ_AHEAD`` shards are read and shuffled on threads of their own (parquet and
        numpy release the interpreter lock, so they use the cores in parallel) while the current
        one is sliced into batches: memory holds those shards, the current one and the rest of
        the previous one.
        """
        skip = start * self.batch_size  # stream rows before the first batch we yield
        todo: deque[tuple[int, int]] = deque()  # (shard, rows to skip at its start)
        for idx in self._order(epoch):
            rows = self.info.shard_rows[idx]
            if skip >= rows:
                skip -= rows
                continue
            todo.append((int(idx), skip))
            skip = 0
        parts: deque[_Columns] = deque()
        have = 0
        # a consumer that stops early closes this generator: the pool then finishes the shards in flight
        with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="shard-reader") as pool:
            ahead: deque[Future] = deque()

            def read_ahead(shards: int) -> None:
                while todo and len(ahead) < shards:
                    idx, skip = todo.popleft()
                    ahead.append(pool.submit(self._load, idx, epoch, skip))

            read_ahead(
                1
            )  # the first batch waits for one shard, not for READ_AHEAD sharing the cores
            while ahead:
                parts.append(ahead.popleft().result())
                read_ahead(READ_AHEAD)
                have += len(parts[-1])
                while have >= self.batch_size:
                    have -= self.batch_size
                    yield _sourced(self._local, _take(parts, self.batch_size), self.batch_size)
        if have and not self.drop_last:
            yield _sourced(self._local, _take(parts, have), have)

    def _local(self, pieces: list[_Columns], n: int) -> Batch:
        """This rank's contiguous share of a global batch of ``n`` rows made of ``pieces`` (as even as
        possible; may be empty), copied into one tensor each: ids [26, b] are the KJT's values.
        Under sharded embeddings the ids are the rank's shards' over all ``n`` rows instead."""
        lo, hi = rank_rows(n, self.rank, self.world_size)
        mine, at = [], 0
        for p in pieces:
            a, b = max(lo, at), min(hi, at + len(p))
            if a < b:
                mine.append(p.rows(a - at, b - at))
            at += len(p)
        b = hi - lo
        dense = torch.empty((b, len(self.dense_names)), dtype=torch.float32, pin_memory=self.pin)
        labels = torch.empty(b, dtype=torch.float32, pin_memory=self.pin)
        # numpy copies: torch's intra-op thread pool would fight the training thread for the cores
        at = 0
        for p in mine:
            k = len(p)
            np.copyto(dense.numpy()[at : at + k], p.dense.T)
            np.copyto(labels.numpy()[at : at + k], p.labels)
            at += k
        if self.multi_hot:
            return self._jagged(dense, labels, pieces, mine)
        if self.owned is not None:
            sparse = self.owned.kjt([p.ids for p in pieces], self.pin)  # type: ignore[misc]
            return Batch(dense, sparse, labels, layout=self.owned)
        ids = torch.empty((len(self.keys), b), dtype=self.id_dtype, pin_memory=self.pin)
        at = 0
        for p in mine:
            np.copyto(ids.numpy()[:, at : at + len(p)], p.ids)  # type: ignore[arg-type]
            at += len(p)
        return self.one_id.batch(dense, ids, labels)

    def _jagged(
        self,
        dense: torch.Tensor,
        labels: torch.Tensor,
        pieces: list[_Columns],
        mine: list[_Columns],
    ) -> Batch:
        """A multi-hot dataset's batch: the lists of this rank's rows ``mine`` (or, under sharded
        embeddings, of its shards over the global batch's ``pieces``) as one jagged KJT."""
        rows = pieces if self.owned is not None else mine
        columns = concat_columns(
            [p.ids for p in rows],  # type: ignore[misc]  # Lists in a multi-hot dataset
            len(self.keys),
            self.np_ids,
        )
        if self.owned is not None:
            sparse = self.owned.kjt_lists(columns, self.np_ids, self.pin)
            return Batch(dense, sparse, labels, layout=self.owned)
        kjt = assemble(self.keys, columns, labels.numel(), self.np_ids, self.pin)
        return Batch(dense, kjt, labels, layout=self.jagged)


def _sourced(
    local: Callable[[list[_Columns], int], Batch], pieces: list[_Columns], n: int
) -> Batch:
    """``local(pieces, n)`` with the shards of the whole global batch attached."""
    batch = local(pieces, n)
    batch.source = tuple(dict.fromkeys(p.shard for p in pieces))
    return batch


def _take(parts: deque[_Columns], n: int) -> list[_Columns]:
    """Remove the first ``n`` rows from the front of ``parts``; returns them as pieces (views)."""
    out = []
    while n:
        p = parts[0]
        if len(p) <= n:
            out.append(parts.popleft())
            n -= len(p)
        else:
            out.append(p.rows(0, n))
            parts[0] = p.rows(n, len(p))
            n = 0
    return out

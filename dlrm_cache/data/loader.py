"""Parquet shards -> batches of torchrec inputs, decoded ahead of time by a background thread.

Batches are slices of one deterministic stream: the split's shards in a (per-epoch shuffled)
order, each shard's rows (per-epoch shuffled) concatenated.  Global batch ``k`` is stream rows
``[k*B, (k+1)*B)``, and under torchrun rank ``r`` of ``W`` takes the ``r``-th ``B/W`` rows of it, so
the global batch does not depend on the number of ranks, and resuming at step ``s`` only needs the
stream position ``s*B`` (whole shards before it are skipped unread).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .format import DENSE_NAMES, LABEL, SPARSE_NAMES, Manifest


@dataclass
class Batch:
    dense: torch.Tensor  # [b, 13] float32
    sparse: KeyedJaggedTensor  # 26 features, one id per sample
    labels: torch.Tensor  # [b] float32
    analysis: object | None = None  # EmbeddingBackend.analyze(sparse), done in the loader thread

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            self.analysis,
        )

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(), self.analysis)

    @property
    def size(self) -> int:
        return self.labels.numel()


def make_batch(dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, keys: list[str]) -> Batch:
    """Build a Batch from row-major arrays ([b,13] dense, [b,26] ranks, [b] labels)."""
    b, f = sparse.shape
    # KJT values are feature-major: all ids of feature 0, then feature 1, ... (what fbgemm expects)
    values = torch.from_numpy(np.ascontiguousarray(sparse.T).reshape(-1).astype(np.int64, copy=False))
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=values,
        lengths=torch.ones(b * f, dtype=torch.int32),
        offsets=torch.arange(b * f + 1, dtype=torch.int32),
        stride=b,
        length_per_key=[b] * f,  # known: saves a reduction over the lengths per consumer
        offset_per_key=[b * i for i in range(f + 1)],
    )
    return Batch(torch.from_numpy(dense), kjt, torch.from_numpy(labels))


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
    ) -> None:
        if split not in manifest.splits:
            raise ValueError(f"{root}: the dataset has no '{split}' split (has {sorted(manifest.splits)})")
        # Training batches split exactly (every rank the same size, so the global batch is the
        # same for any rank count); evaluation batches may split unevenly.
        if batch_size <= 0 or (drop_last and batch_size % world_size):
            raise ValueError(
                f"{key}={batch_size}: must be a positive multiple of the number of ranks ({world_size})"
            )
        self.root = Path(root)
        self.info = manifest.splits[split]
        self.table_sizes = manifest.table_sizes
        self.split = split
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.keys = list(manifest.sparse_names)
        self.dense_names = list(manifest.dense_names)

    def __len__(self) -> int:
        """Global batches per epoch."""
        full, rest = divmod(self.info.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.info.shards)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch, 0xD1]).permutation(n)

    def _read_shard(self, idx: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        path = self.root / self.info.shards[idx]
        table = pq.read_table(path)
        try:
            labels = table.column(LABEL).to_numpy().astype(np.float32)  # a writable copy
            dense = np.stack([table.column(c).to_numpy() for c in self.dense_names], axis=1).astype(
                np.float32, copy=False
            )
            sparse = np.stack([table.column(c).to_numpy() for c in self.keys], axis=1)
        except KeyError as e:
            raise ValueError(f"{path}: missing column {e}; preprocess the data again") from None
        too_big = sparse.max(axis=0, initial=-1) >= np.asarray(self.table_sizes)
        if too_big.any() or (sparse.size and sparse.min() < 0):
            j = int(np.argmax(too_big)) if too_big.any() else int(np.argmin(sparse.min(axis=0)))
            raise ValueError(
                f"{path}: column {self.keys[j]} holds ids outside [0, {self.table_sizes[j]}) "
                "(shard and manifest do not match; preprocess again)"
            )
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch, idx]).permutation(len(labels))
            labels, dense, sparse = labels[perm], dense[perm], sparse[perm]
        return dense, sparse, labels

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """This rank's part of global batches ``start, start+1, ...`` of ``epoch``."""
        skip = start * self.batch_size  # stream rows before the first batch we yield
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        have = 0
        for idx in self._order(epoch):
            rows = self.info.shard_rows[idx]
            if skip >= rows:
                skip -= rows
                continue
            dense, sparse, labels = self._read_shard(idx, epoch)
            if skip:
                dense, sparse, labels = dense[skip:], sparse[skip:], labels[skip:]
                skip = 0
            parts.append((dense, sparse, labels))
            have += len(labels)
            while have >= self.batch_size:
                (dense, sparse, labels), parts = _take(parts, self.batch_size)
                have -= self.batch_size
                yield self._local(dense, sparse, labels)
        if have and not self.drop_last:
            (dense, sparse, labels), _ = _take(parts, have)
            yield self._local(dense, sparse, labels)

    def _local(self, dense, sparse, labels) -> Batch:
        """This rank's contiguous share of a global batch (as even as possible; may be empty)."""
        n = len(labels)
        lo, hi = (n * self.rank) // self.world_size, (n * (self.rank + 1)) // self.world_size
        return make_batch(dense[lo:hi], sparse[lo:hi], labels[lo:hi], self.keys)


def _take(parts, n):
    """The first n rows of a list of (dense, sparse, labels) chunks, and what is left."""
    out, left, need = [], [], n
    for i, part in enumerate(parts):
        if need == 0:
            left.extend(parts[i:])
            break
        k = min(need, len(part[2]))
        out.append(tuple(a[:k] for a in part))
        if k < len(part[2]):
            left.append(tuple(a[k:] for a in part))
        need -= k
    cat = tuple(np.concatenate([p[j] for p in out]) if len(out) > 1 else out[0][j] for j in range(3))
    return cat, left


class Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead (decode overlaps training).

    ``transform`` (the embedding cache's per-batch analysis) runs on ``workers`` threads, items
    still coming out in order: numpy releases the GIL, so at large batches this keeps the loader
    ahead of a fast device.
    """

    _END = object()

    def __init__(
        self,
        it: Iterator,
        depth: int = 4,
        pin: bool = False,
        transform: Callable | None = None,
        workers: int = 1,
    ) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._pin = pin
        self._transform = transform
        self._workers = max(1, workers)
        self._thread = threading.Thread(target=self._run, args=(it,), daemon=True)
        self._thread.start()

    def _finish(self, item):
        if self._transform is not None:
            item = self._transform(item)
        return item.pin_memory() if self._pin else item

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, it: Iterator) -> None:
        pool = ThreadPoolExecutor(self._workers) if self._workers > 1 else None
        pending: deque = deque()
        try:
            for item in it:
                if pool is None:
                    if not self._put(self._finish(item)):
                        return
                    continue
                pending.append(pool.submit(self._finish, item))
                if len(pending) >= self._workers and not self._put(pending.popleft().result()):
                    return
            while pending:
                if not self._put(pending.popleft().result()):
                    return
            self._q.put(self._END)
        except BaseException as e:  # surfaced in the consumer, with its traceback
            self._q.put(e)
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.1)
            except queue.Empty:
                pass

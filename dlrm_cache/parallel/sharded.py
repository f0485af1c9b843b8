"""Model-parallel embeddings: each rank owns shards (whole tables or row ranges of one).

Every rank's loader hands it its own shards' ids for *all* samples of the global batch
(:class:`~dlrm_cache.parallel.owned.OwnedShards`, built on the loader thread), so no ids travel at
step time.  The rank looks them up in its local backend and sends each batch rank its rows of the
pooled result by one all-to-all; gradients take the reverse path in backward.  The exchange's
sizes follow from the global batch size and the rank count (:func:`rank_sizes`, the loader's own
split), so the step never reads a size or a count back from a device.  A row-wise split table comes
back as one partial sum per shard, added up on the batch's rank (autograd sends the gradient to
every shard); mean pooling divides only that total, by the bag sizes the shards send beside
their sums (:meth:`ShardedEmbeddings.pool`).  Everything is synchronous collectives, so the result does not depend on timing, and
the same code runs on gloo (CPU) and NCCL (GPU).

The wrapper is itself an :class:`EmbeddingBackend`: its input is the rank's shards' KJT over the
global batch, its output the pooled embeddings of the rank's rows for every table, in table order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..config.choices import Pooling
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, bag_sizes
from .owned import rank_sizes
from .placement import Shard


class ShardedEmbeddings(EmbeddingBackend):
    """Table-wise and row-wise sharding of an embedding backend over the default process group.

    ``forward``/``prefetch`` take the KJT of this rank's shards (:attr:`mine`, keys in
    that order) over the whole global batch, as a loader built with those shards makes it.
    """

    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        shards: list[Shard],
        make_local: Callable[[list[TableSpec], list[Shard]], EmbeddingBackend],
        device: torch.device,
    ) -> None:
        super().__init__(tables, optim)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device
        self.dim = tables[0].dim
        self.shards = list(shards)
        self.by_rank = [[s for s in shards if s.rank == r] for r in range(self.world)]
        self.mine = self.by_rank[self.rank]
        self._mine_keys = [s.name for s in self.mine]
        local_tables = [TableSpec(s.name, s.hi - s.lo, self.dim) for s in self.mine]
        self.local = make_local(local_tables, self.mine) if self.mine else None
        # prefetch is local (no collective), so the ranks need not agree on a look-ahead
        self.lookahead = self.local.lookahead if self.local is not None else 0
        # received pooled blocks are rank-major; put them back in global shard order, then add the
        # shards of each table together (one shard per table when nothing is split row-wise)
        order = [s.name for shards_r in self.by_rank for s in shards_r]
        index = {n: i for i, n in enumerate(order)}
        self._unpermute = torch.tensor([index[s.name] for s in self.shards], device=device)
        table_index = {t.name: i for i, t in enumerate(tables)}
        self._shard_table = torch.tensor([table_index[s.table] for s in self.shards], device=device)
        self._row_wise = len(self.shards) != len(tables)

    def _check(self, features: KeyedJaggedTensor) -> None:
        if list(features.keys()) != self._mine_keys:
            raise ValueError(
                f"rank {self.rank} owns shards {self._mine_keys} but got a batch of "
                f"{list(features.keys())}: the loader must be built with this rank's shards"
            )

    # -- the interface -------------------------------------------------------------------------
    def prefetch(self, features: KeyedJaggedTensor, copied: Any = None) -> None:
        self._check(features)
        if self.local is not None:
            self.local.prefetch(features, copied)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self.pool(features, Pooling.sum)

    def pool(self, features: KeyedJaggedTensor, pooling: Pooling) -> KeyedTensor:
        """The rank's samples' pooled embeddings of every table.

        Mean pooling cannot be taken per shard (a row range holds part of a bag): each shard's
        block travels with one more column, its bags' sizes (the shard KJT's lengths, on the
        device), and the batch's rank adds sums and sizes of a table's shards before dividing.
        The sizes ride in the same all-to-all: no extra collective, nothing read back."""
        self._check(features)
        n = features.stride()  # the global batch
        sizes = rank_sizes(n, self.world)  # eval batches may split unevenly, a share may be empty
        b = sizes[self.rank]
        mean = pooling is Pooling.mean
        width = self.dim + int(mean)  # per shard: its sums, and its bags' sizes under mean
        if self.local is not None:
            mine = self.local(features).values()  # [n, shards_mine * D]
            if mean:
                counts = bag_sizes(features).to(mine.dtype).unsqueeze(-1)
                mine = torch.cat([mine.view(n, -1, self.dim), counts], dim=2).view(n, -1)
        else:
            mine = torch.zeros(n, 0, device=self.device, requires_grad=True)
        widths = [len(shards_r) * width for shards_r in self.by_rank]
        # Each rank's loss is a mean over its local rows; scaling the returning gradients by 1/W
        # makes the update the one a single process would make for the whole global batch.
        out = _PooledAllToAll.apply(mine, sizes, widths, b, 1.0 / self.world)
        out = out.view(b, len(self.shards), width)
        out = out.index_select(1, self._unpermute)  # [b, shards, width] in global shard order
        if self._row_wise:
            out = out.new_zeros(b, len(self.tables), width).index_add(1, self._shard_table, out)
        if mean:
            out = out[..., : self.dim] / out[..., self.dim :].clamp(min=1)
        return KeyedTensor(
            keys=self.feature_names,
            length_per_key=[self.dim] * len(self.tables),
            values=out.reshape(b, len(self.tables) * self.dim),
        )

    def step_done(self) -> None:
        if self.local is not None:
            self.local.step_done()

    def cancel_prefetch(self, grad: bool | None = None) -> None:
        if self.local is not None:
            self.local.cancel_prefetch(grad)

    def set_learning_rate(self, lr: float) -> None:
        if self.local is not None:
            self.local.set_learning_rate(lr)

    def flush(self) -> None:
        if self.local is not None:
            self.local.flush()

    def stats(self) -> dict[str, float]:
        return self.local.stats() if self.local is not None else {}

    def reset_stats(self) -> None:
        if self.local is not None:
            self.local.reset_stats()

    def export_tables(self) -> dict[str, torch.Tensor]:
        """This rank's shards, keyed ``<table>.<field>`` or ``<table>:<lo>-<hi>.<field>``."""
        return self.local.export_tables() if self.local is not None else {}

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        if self.local is not None:
            keys = set(self.local.state_keys())
            self.local.import_tables({k: v for k, v in state.items() if k in keys})

    def state_keys(self) -> list[str]:
        return self.local.state_keys() if self.local is not None else []


class _PooledAllToAll(torch.autograd.Function):
    """Owner -> batch rank exchange of pooled embeddings.

    Forward on rank r: ``x`` is [sum(sizes), w_r] (its shards for every rank's samples); the rows of
    rank s go to rank s.  Rank s receives [sizes[s], w_r] from every r and concatenates the
    columns rank-major into [sizes[s], sum(w)].  Backward is the same exchange reversed.
    """

    @staticmethod
    def forward(ctx, x, sizes: list[int], widths: list[int], b: int, grad_scale: float):
        rank = dist.get_rank()
        ctx.sizes, ctx.widths, ctx.b, ctx.grad_scale, ctx.rank = sizes, widths, b, grad_scale, rank
        w_me = widths[rank]
        send = x.contiguous().view(-1)
        in_splits = [s * w_me for s in sizes]
        out_splits = [b * w for w in widths]
        recv = x.new_empty(sum(out_splits))
        dist.all_to_all_single(recv, send, out_splits, in_splits)
        blocks = [blk.view(b, w) for blk, w in zip(recv.split(out_splits), widths)]
        return torch.cat(blocks, dim=1)

    @staticmethod
    def backward(ctx, grad):
        sizes, widths, b, rank = ctx.sizes, ctx.widths, ctx.b, ctx.rank
        w_me = widths[rank]
        blocks = (grad * ctx.grad_scale).split(widths, dim=1)
        send = torch.cat([blk.contiguous().view(-1) for blk in blocks])
        recv = grad.new_empty(sum(sizes) * w_me)
        dist.all_to_all_single(recv, send, [s * w_me for s in sizes], [b * w for w in widths])
        return recv.view(sum(sizes), w_me), None, None, None, None

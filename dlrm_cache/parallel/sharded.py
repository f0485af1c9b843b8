"""Model-parallel embeddings: each rank owns shards (whole tables or row ranges of one).

Per step, ids travel to the owner of their shard and pooled embeddings travel back, both by
all-to-all; gradients take the reverse path in backward.  A row-wise split table comes back as one
partial sum per shard, added up on the batch's rank (autograd sends the gradient to every shard).
Everything is synchronous collectives, so the result does not depend on timing, and the same code
runs on gloo (CPU) and NCCL (GPU).

The wrapper is itself an :class:`EmbeddingBackend`, so the model and the trainer do not change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, pooled, pop_prefetched
from .placement import Shard


class ShardedEmbeddings(EmbeddingBackend):
    """Table-wise and row-wise sharding of an embedding backend over the default process group."""

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
        # NCCL moves device tensors only; gloo moves host tensors
        self.comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.dim = tables[0].dim
        self.shards = list(shards)
        self.by_rank = [[s for s in shards if s.rank == r] for r in range(self.world)]
        self.mine = self.by_rank[self.rank]
        local_tables = [TableSpec(s.name, s.hi - s.lo, self.dim) for s in self.mine]
        self.local = make_local(local_tables, self.mine) if self.mine else None
        # Every rank must prefetch (each prefetch is a collective), also one that owns no shard.
        depth = torch.tensor([self.local.lookahead if self.local is not None else 0], device=self.comm_device)
        dist.all_reduce(depth, op=dist.ReduceOp.MAX)
        self.lookahead = int(depth.item())
        # received pooled blocks are rank-major; put them back in global shard order, then add the
        # shards of each table together (one shard per table when nothing is split row-wise)
        order = [s.name for shards_r in self.by_rank for s in shards_r]
        index = {n: i for i, n in enumerate(order)}
        self._unpermute = torch.tensor([index[s.name] for s in self.shards], device=device)
        table_index = {t.name: i for i, t in enumerate(tables)}
        self._shard_table = torch.tensor([table_index[s.table] for s in self.shards], device=device)
        self._row_wise = len(self.shards) != len(tables)
        self._pending: deque[tuple[KeyedJaggedTensor, KeyedJaggedTensor | None, list[int], bool]] = deque()

    # -- ids to their owners -----------------------------------------------------------------
    def _per_key(self, kjt: KeyedJaggedTensor, b: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """feature -> (ids, lengths) of a batch; works for an empty batch (a rank's share of an
        uneven last evaluation batch can be zero rows, which KeyedJaggedTensor.to_dict rejects)."""
        lengths = kjt.lengths().long().view(len(kjt.keys()), b)
        values = kjt.values().long().split(lengths.sum(1).tolist())
        return {k: (v, l) for k, v, l in zip(kjt.keys(), values, lengths)}

    def _shard_ids(self, per_key, s: Shard) -> tuple[torch.Tensor, torch.Tensor]:
        """(lengths per sample, ids relative to the shard) of this rank's batch for shard ``s``."""
        values, lengths = per_key[s.table]
        if (s.lo, s.hi) == (0, s.rows_in_table):
            return lengths, values
        inside = (values >= s.lo) & (values < s.hi)
        sample = torch.repeat_interleave(torch.arange(lengths.numel(), device=values.device), lengths)
        return torch.bincount(sample[inside], minlength=lengths.numel()), values[inside] - s.lo

    def _dist_ids(self, kjt: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor | None, list[int]]:
        b = kjt.stride()
        cd = self.comm_device
        sizes_t = [torch.zeros(1, dtype=torch.int64, device=cd) for _ in range(self.world)]
        dist.all_gather(sizes_t, torch.tensor([b], dtype=torch.int64, device=cd))
        batch_sizes = [int(s) for s in sizes_t]  # eval batches may differ by a row between ranks
        per_key = self._per_key(kjt, b)
        lengths_out, values_out, val_in = [], [], []
        for shards_r in self.by_rank:
            n_vals = 0
            for s in shards_r:
                lengths, values = self._shard_ids(per_key, s)
                lengths_out.append(lengths)
                values_out.append(values)
                n_vals += values.numel()
            val_in.append(n_vals)
        empty = torch.zeros(0, dtype=torch.int64, device=cd)
        lengths_send = torch.cat(lengths_out).to(cd) if lengths_out else empty
        values_send = torch.cat(values_out).to(cd) if values_out else empty
        n_mine = len(self.mine)
        len_in = [len(shards_r) * b for shards_r in self.by_rank]
        len_out = [n_mine * bs for bs in batch_sizes]
        lengths_recv = torch.empty(sum(len_out), dtype=torch.int64, device=cd)
        dist.all_to_all_single(lengths_recv, lengths_send, len_out, len_in)
        val_out = [int(c.sum()) for c in lengths_recv.split(len_out)]
        values_recv = torch.empty(sum(val_out), dtype=torch.int64, device=cd)
        dist.all_to_all_single(values_recv, values_send, val_out, val_in)
        if not n_mine:
            return None, batch_sizes
        # received blocks are (source rank, shard, sample): regroup as (shard, source, sample)
        lengths_by_src = [l.view(n_mine, -1) for l in lengths_recv.split(len_out)]
        seg = [list(v.split(l.sum(1).tolist())) for v, l in zip(values_recv.split(val_out), lengths_by_src)]
        lengths, values = [], []
        for f in range(n_mine):
            for src in range(self.world):
                lengths.append(lengths_by_src[src][f])
                values.append(seg[src][f])
        local = KeyedJaggedTensor.from_lengths_sync(
            keys=[s.name for s in self.mine],
            values=torch.cat(values).to(self.device),
            lengths=torch.cat(lengths).to(self.device).int(),
        )
        return local, batch_sizes

    # -- the interface -------------------------------------------------------------------------
    def prefetch(self, features: KeyedJaggedTensor, analysis: object | None = None) -> None:
        local, sizes = self._dist_ids(features)
        if self.local is not None and local is not None:
            self.local.prefetch(local)
        self._pending.append((features, local, sizes, torch.is_grad_enabled()))

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        entry = pop_prefetched(self._pending, features, lambda e: e[0], lambda e: e[3])
        if entry is not None:
            _, local, sizes, _ = entry
        else:
            local, sizes = self._dist_ids(features)
        b = features.stride()
        if self.local is not None:
            mine = self.local(local).values()  # [sum(sizes), shards_mine * D]
        else:
            mine = torch.zeros(sum(sizes), 0, device=self.device, requires_grad=True)
        widths = [len(shards_r) * self.dim for shards_r in self.by_rank]
        # Each rank's loss is a mean over its local rows; scaling the returning gradients by 1/W
        # makes the update the one a single process would make for the whole global batch.
        out = _PooledAllToAll.apply(mine, sizes, widths, b, 1.0 / self.world)
        out = out.view(b, len(self.shards), self.dim).index_select(1, self._unpermute)  # [B, shards, D]
        if self._row_wise:
            out = out.new_zeros(b, len(self.tables), self.dim).index_add(1, self._shard_table, out)
        return pooled(features, out.reshape(b, len(self.tables) * self.dim), self.dim)

    def step_done(self) -> None:
        if self.local is not None:
            self.local.step_done()

    def cancel_prefetch(self, grad: bool | None = None) -> None:
        for entry in [e for e in self._pending if grad is None or e[3] == grad]:
            self._pending.remove(entry)
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

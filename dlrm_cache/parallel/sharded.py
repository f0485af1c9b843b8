"""Model-parallel embeddings: each rank owns whole tables (host memory + its own cache for them).

Per step, ids travel to the owner of their table and pooled embeddings travel back, both by
all-to-all; gradients take the reverse path in backward.  Everything is synchronous collectives, so
the result does not depend on timing, and the same code runs on gloo (CPU) and NCCL (GPU).

The wrapper is itself an :class:`EmbeddingBackend`, so the model and the trainer do not change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, pooled


class ShardedEmbeddings(EmbeddingBackend):
    """Table-wise sharding of an embedding backend over the default process group."""

    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        owner: dict[str, int],
        make_local: Callable[[list[TableSpec]], EmbeddingBackend],
        device: torch.device,
    ) -> None:
        super().__init__(tables, optim)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device
        # NCCL moves device tensors only; gloo moves host tensors
        self.comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.owner = owner
        self.dim = tables[0].dim
        # features owned by each rank, in global feature order
        self.by_rank = [[t.name for t in tables if owner[t.name] == r] for r in range(self.world)]
        self.mine = [t for t in tables if owner[t.name] == self.rank]
        self.local = make_local(self.mine) if self.mine else None
        self.lookahead = int(getattr(self.local, "lookahead", 0))
        order = [n for names in self.by_rank for n in names]  # receive order: rank-major
        index = {n: i for i, n in enumerate(order)}
        # column blocks of the received [B, F*D] tensor, back into global feature order
        self._unpermute = torch.cat(
            [torch.arange(index[n] * self.dim, (index[n] + 1) * self.dim) for n in self.feature_names]
        ).to(device)
        self._pending: deque[tuple[KeyedJaggedTensor, KeyedJaggedTensor | None, list[int]]] = deque()

    # -- ids to their owners -----------------------------------------------------------------
    def _dist_ids(self, kjt: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor | None, list[int]]:
        b = kjt.stride()
        cd = self.comm_device
        sizes = [torch.zeros(1, dtype=torch.int64, device=cd) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([b], dtype=torch.int64, device=cd))
        batch_sizes = [int(s) for s in sizes]  # eval batches may differ by a row between ranks
        per_key = kjt.to_dict()
        lengths_out, values_out = [], []
        for names in self.by_rank:
            lengths_out += [per_key[n].lengths() for n in names]
            values_out += [per_key[n].values() for n in names]
        empty = torch.zeros(0, dtype=torch.int64, device=cd)
        lengths_send = torch.cat(lengths_out).long().to(cd) if lengths_out else empty
        values_send = torch.cat(values_out).long().to(cd) if values_out else empty
        n_mine = len(self.mine)
        len_in = [len(names) * b for names in self.by_rank]
        len_out = [n_mine * bs for bs in batch_sizes]
        lengths_recv = torch.empty(sum(len_out), dtype=torch.int64, device=lengths_send.device)
        dist.all_to_all_single(lengths_recv, lengths_send, len_out, len_in)
        val_in = [
            int(sum(per_key[n].values().numel() for n in names)) for names in self.by_rank
        ]
        val_out = [int(c.sum()) for c in lengths_recv.split(len_out)]
        values_recv = torch.empty(sum(val_out), dtype=torch.int64, device=values_send.device)
        dist.all_to_all_single(values_recv, values_send, val_out, val_in)
        if not n_mine:
            return None, batch_sizes
        # received blocks are (source rank, feature, sample): regroup as (feature, source, sample)
        lengths_by_src = [l.view(n_mine, -1) for l in lengths_recv.split(len_out)]
        values_by_src = list(values_recv.split(val_out))
        lengths, values = [], []
        seg = [list(v.split(l.sum(1).tolist())) for v, l in zip(values_by_src, lengths_by_src)]
        for f in range(n_mine):
            for s in range(self.world):
                lengths.append(lengths_by_src[s][f])
                values.append(seg[s][f])
        local = KeyedJaggedTensor.from_lengths_sync(
            keys=[t.name for t in self.mine],
            values=torch.cat(values).to(self.device),
            lengths=torch.cat(lengths).to(self.device).int(),
        )
        return local, batch_sizes

    # -- the interface -------------------------------------------------------------------------
    def prefetch(self, features: KeyedJaggedTensor) -> None:
        local, sizes = self._dist_ids(features)
        if self.local is not None and local is not None:
            self.local.prefetch(local)
        self._pending.append((features, local, sizes))

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        if self._pending and self._pending[0][0] is features:
            _, local, sizes = self._pending.popleft()
        else:
            local, sizes = self._dist_ids(features)
        b = features.stride()
        if self.local is not None:
            mine = self.local(local).values()  # [sum(sizes), F_mine * D]
        else:
            mine = torch.zeros(sum(sizes), 0, device=self.device, requires_grad=True)
        widths = [len(names) * self.dim for names in self.by_rank]
        # Each rank's loss is a mean over its local rows; scaling the returning gradients by 1/W
        # makes the update the one a single process would make for the whole global batch.
        out = _PooledAllToAll.apply(mine, sizes, widths, b, 1.0 / self.world)
        out = out.index_select(1, self._unpermute)
        return pooled(features, out, self.dim)

    def cancel_prefetch(self) -> None:
        self._pending.clear()
        if self.local is not None:
            self.local.cancel_prefetch()

    def set_learning_rate(self, lr: float) -> None:
        if self.local is not None:
            self.local.set_learning_rate(lr)

    def flush(self) -> None:
        if self.local is not None:
            self.local.flush()

    def stats(self) -> dict[str, float]:
        return self.local.stats() if self.local is not None else {}

    def export_tables(self) -> dict[str, torch.Tensor]:
        return self.local.export_tables() if self.local is not None else {}

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        if self.local is not None:
            self.local.import_tables({k: v for k, v in state.items() if k.split(".")[0] in self.owner
                                      and self.owner[k.split(".")[0]] == self.rank})

    def state_keys(self) -> list[str]:
        return self.local.state_keys() if self.local is not None else []


class _PooledAllToAll(torch.autograd.Function):
    """Owner -> batch rank exchange of pooled embeddings.

    Forward on rank r: ``x`` is [sum(sizes), w_r] (its tables for every rank's samples); the rows of
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

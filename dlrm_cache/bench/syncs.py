"""Count, on any device, the operations that would make the host wait for a CUDA device.

A CUDA kernel launch returns at once; the host only waits where it needs a result's *value* or
*size*: reading a scalar (``item``, ``int()``, ``bool()``, ``tolist``), and ops whose output size
depends on the data (``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing,
``repeat_interleave`` without ``output_size``).  Those are the same aten ops on the CPU, so a
``TorchDispatchMode`` counts them there too: the tests bound the freq_cache's host synchronizations
per batch without a GPU, and ``bench kind=planning`` prints them.

``Tensor.tolist()`` and ``Tensor.numpy()`` read memory without an aten op on CPU tensors, so they
are counted by wrapping those two methods while the counter is active (in the thread that entered
it: dispatch modes are per thread, and so is what it counts) -- including reads of
tensors that are host data under CUDA too (a host batch's lengths), which makes the count an
upper bound of the synchronizations on a GPU, never an undercount.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# output size or value needed on the host, whatever the arguments
_ALWAYS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten._unique2.default: "unique",
    aten._unique.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.masked_select.default: "masked_select",
    aten.equal.default: "equal",
    aten.is_nonzero.default: "item",
}
_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}


def _sync_kind(func, args, kwargs) -> str | None:
    if func in _ALWAYS:
        return _ALWAYS[func]
    if func in _INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(i is not None and i.dtype == torch.bool for i in indices):
            return "bool_index"
    if (
        func is aten.repeat_interleave.Tensor
        and kwargs.get("output_size") is None
        and len(args) < 2
    ):
        return "repeat_interleave"
    if func is aten.repeat_interleave.self_Tensor and kwargs.get("output_size") is None:
        return "repeat_interleave"
    return None


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as c: ...`` -> ``c.syncs`` (by kind), ``c.ops`` (all aten ops by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self._saved: dict[str, tuple[Any, Any]] = {}
        self._thread = 0
        self._entry: object | None = None

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops[func.overloadpacket.__name__] += 1
        kind = _sync_kind(func, args, kwargs)
        if kind is not None:
            self.syncs[kind] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        self._thread = threading.get_ident()
        entry = self._entry = object()  # this entry's wrappers count only while it lasts
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, _name=name, **kw):
                if self._entry is entry and threading.get_ident() == self._thread:
                    self.syncs[_name] += 1
                return _original(t, *a, **kw)

            self._saved[name] = (original, counted)
            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        # Counters entered on different threads (a planner thread's, the training thread's) may
        # leave out of order: each puts the method back only where its own wrapper is still in
        # place, so it never removes one wrapped over it; a wrapper left behind counts nothing.
        for name, (original, counted) in self._saved.items():
            if getattr(torch.Tensor, name) is counted:
                setattr(torch.Tensor, name, original)
        self._saved.clear()
        self._entry = None
        return super().__exit__(*exc)

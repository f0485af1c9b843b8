"""The known third-party messages are dropped by name; everything else of the same loggers and
warning categories, real errors above all, still shows."""

from __future__ import annotations

import logging
import warnings

import pytest

from dlrm_cache.console.say import KnownMessageFilter, quiet_known_noise


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def logger_sees():
    """Collect what passes a logger's filters (a handler on the logger itself, not on an ancestor)."""
    attached: list[tuple[logging.Logger, Collect, int]] = []

    def attach(name: str | None) -> Collect:
        logger = logging.getLogger(name)
        h = Collect()
        attached.append((logger, h, logger.level))
        logger.addHandler(h)
        logger.setLevel(logging.DEBUG)
        return h

    yield attach
    for logger, h, level in attached:
        logger.removeHandler(h)
        logger.setLevel(level)


def test_fbgemm_compat_table_warning_is_dropped_and_load_errors_are_not(logger_sees):
    """fbgemm_gpu's own _load_library: a version missing from its table (what 1.6.0 logs 4-14 times
    per process) is dropped; the mismatch warning and a library that fails to load still show."""
    import fbgemm_gpu

    quiet_known_noise()
    root = logger_sees(None)
    fbgemm_gpu._load_library("no_such_library.so", "0.1.0", no_throw=True)
    assert not any("_fbgemm_torch_compat_table" in m for m in root.messages)
    assert any("Could not load the library 'no_such_library.so'" in m for m in root.messages)
    fbgemm_gpu._load_library("no_such_library.so", "1.1.0", no_throw=True)  # pairs with torch 2.6
    assert any("which is not guaranteed to be" in m for m in root.messages)
    # the filter is installed once, however often the commands start
    quiet_known_noise()
    assert sum(isinstance(f, KnownMessageFilter) for f in logging.getLogger().filters) == 1


def test_fx_tracing_notice_is_dropped_other_fx_messages_are_not(logger_sees):
    import torch.fx._symbolic_trace as st

    quiet_known_noise()
    seen = logger_sees("torch.fx._symbolic_trace")
    st.is_fx_tracing_warning.cache_clear()  # torch logs it once per process
    st.is_fx_tracing_warning()
    logging.getLogger("torch.fx._symbolic_trace").warning("something else about fx tracing")
    assert seen.messages == ["something else about fx tracing"]


def test_b200_user_warning_is_dropped_by_message_and_category():
    b200 = (
        "TBE B200 optimization: device_major=9, feature_enabled=0, segment_length=1024 (Triggered "
        "internally at gen_embedding_backward_rowwise_adagrad_split_unweighted_cuda.cu:575.)"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_noise()
        warnings.warn(b200, UserWarning)
        warnings.warn("TBE something else", UserWarning)
        warnings.warn(b200, RuntimeWarning)  # same text, another category: not ours to hide
    assert [(w.category, str(w.message)[:20]) for w in caught] == [
        (UserWarning, "TBE something else"),
        (RuntimeWarning, b200[:20]),
    ]


def test_searchsorted_strided_boundary_notice_is_dropped_by_message_and_category():
    """The freq_cache's plan of a multi-hot batch searches the tables' starts, a strided view of
    the batch's offsets: torch says once that it copies them.  Dropped; other notices are not."""
    notice = (
        "torch.searchsorted(): boundary tensor is non-contiguous, this will lower the performance "
        "due to extra data copy when converting non-contiguous tensor to contiguous, please use "
        "contiguous boundary tensor if possible. This message will only appear once per program."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_noise()
        warnings.warn(notice, UserWarning)
        warnings.warn("torch.searchsorted(): something else", UserWarning)
    assert [str(w.message) for w in caught] == ["torch.searchsorted(): something else"]

"""DLRM-DCN (model=dcn) trains under every placement that runs on the CPU (host, freq_cache), every precision and
compile setting, and over 2 gloo ranks: each gives the host-placed, one-process fp32 model (the
cross network's weights included), or stays within bf16's rounding of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_distributed import _in_process, _overrides, _state, launch, run_single
from tiny import TINY_MODEL

STEPS = 12
# the MLPerf model's layout, narrowed to this machine (every dcn key set from the command line)
DCN = [
    "model=dcn",
    *TINY_MODEL,
    "model.dcn_num_layers=2",
    "model.dcn_low_rank_dim=4",
    f"max_steps={STEPS}",
]
CROSS_KEYS = {f"dense.inter_arch.crossnet.{k}_kernels.{i}" for k in "WV" for i in range(2)}


def _checkpoint(run: Path) -> dict[str, torch.Tensor]:
    return _state(run / f"checkpoints/step_{STEPS:08d}")


@pytest.fixture(scope="module")
def host(processed_synth: Path, tmp_path_factory) -> tuple[dict, dict[str, torch.Tensor], Path]:
    run = tmp_path_factory.mktemp("dcn") / "host"
    summary = run_single(_overrides(processed_synth, run, DCN))[0]
    return summary, _checkpoint(run), run


def _assert_same_model(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert state.keys() == reference.keys() and CROSS_KEYS <= state.keys()
    for k in reference:
        torch.testing.assert_close(state[k], reference[k], rtol=1e-4, atol=1e-5, msg=k)


def test_dcn_freq_cache_trains_the_host_model(host, processed_synth, tmp_path):
    """hbm and uvm_cache need a GPU (tests/embedding/test_gpu.py runs the placements there)."""
    placement = ["embedding=freq_cache", "embedding.cache_ratio=0.05"]
    summary = run_single(_overrides(processed_synth, tmp_path / "run", DCN + placement))[0]
    _assert_same_model(_checkpoint(tmp_path / "run"), host[1])
    assert summary["val_auc"] == pytest.approx(host[0]["val_auc"], abs=1e-4)


def test_dcn_bf16_compiled_stays_near_fp32(host, processed_synth, tmp_path):
    """The cross network under bf16 autocast inside torch.compile'd dense path: weights stay fp32,
    the model within bf16's rounding of the fp32 one after 12 steps."""
    extra = ["precision=bf16", "compile=true"]
    summary = run_single(_overrides(processed_synth, tmp_path / "run", DCN + extra))[0]
    state = _checkpoint(tmp_path / "run")
    assert {state[k].dtype for k in CROSS_KEYS} == {torch.float32}
    assert summary["val_auc"] == pytest.approx(host[0]["val_auc"], abs=5e-3)
    assert summary["val_logloss"] == pytest.approx(host[0]["val_logloss"], abs=5e-3)


def test_dcn_two_ranks_with_sharded_freq_cache_match_one_rank(host, processed_synth, tmp_path):
    extra = ["embedding=freq_cache", "embedding.cache_ratio=0.05", "shard_rows_above=50"]
    out = launch(2, _overrides(processed_synth, tmp_path / "two", DCN + extra))
    _assert_same_model(_checkpoint(tmp_path / "two"), host[1])
    assert out[0]["val_auc"] == pytest.approx(host[0]["val_auc"], abs=1e-4)


def test_resume_refuses_the_other_interaction(host, processed_synth, tmp_path):
    """A DCN checkpoint resumed as a dot model: refused before anything is built, naming the key."""
    dot = [x for x in DCN if not x.startswith("model=")] + [f"resume={host[2]}", "max_steps=20"]
    result = _in_process(_overrides(processed_synth, tmp_path / "again", dot))[0]
    assert "model.interaction='dcn' (now 'dot')" in str(result), result


def test_resume_compares_the_cross_network_only_between_dcn_models(
    processed_synth: Path, tmp_path: Path
):
    """A dot run resumes whatever ``model.dcn_*`` say (a dot model has no cross network); a
    checkpoint written before ``model.interaction`` existed is a dot model's, so resuming it as
    DCN is refused naming the key (not a state_dict traceback)."""
    dot = [x for x in DCN if not x.startswith(("model=", "model.dcn"))]
    run = tmp_path / "dot"
    run_single(_overrides(processed_synth, run, dot))
    ckpt = run / f"checkpoints/step_{STEPS:08d}"
    again = dot + [f"resume={ckpt}", "max_steps=14", "model.dcn_num_layers=3"]
    assert run_single(_overrides(processed_synth, tmp_path / "again", again))[0]["steps"] == 14
    meta = json.loads((ckpt / "meta.json").read_text())
    for k in ("interaction", "dcn_num_layers", "dcn_low_rank_dim", "pooling"):
        del meta["config"]["model"][k]  # as written before the keys
    (ckpt / "meta.json").write_text(json.dumps(meta))
    as_dcn = DCN + [f"resume={ckpt}", "max_steps=14", "model.pooling=mean"]
    result = _in_process(_overrides(processed_synth, tmp_path / "dcn", as_dcn))[0]
    # and a model of before model.pooling summed its ids
    for named in ("model.interaction='dot' (now 'dcn')", "model.pooling='sum' (now 'mean')"):
        assert named in str(result), result

"""DLRM-DCN (DCN-v2 interaction): torchrec's DLRM_DCN and ours, given the same weights, give the
same logits and the same gradients; the dense part's shapes (memory estimate, checkpoint checks)
include the cross network."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchrec.models.dlrm import DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.model.dcn import CrossShape, cross_shape
from dlrm_cache.model.dlrm import DLRM, dense_shapes, dense_state_problem

ROWS, DIM, NUM_DENSE, BATCH = (11, 23, 7), 8, 5, 6
CROSS = CrossShape(num_layers=3, low_rank_dim=4)


def _pair() -> tuple[DLRM_DCN, DLRM]:
    """torchrec's DLRM_DCN (its own initialisation) and ours with its weights, tables included."""
    torch.manual_seed(0)
    names = [f"C{i + 1}" for i in range(len(ROWS))]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[n])
            for n, r in zip(names, ROWS)
        ],
        device=torch.device("cpu"),
    )
    theirs = DLRM_DCN(ebc, NUM_DENSE, [16, DIM], [12, 1], CROSS.num_layers, CROSS.low_rank_dim)
    emb = HostBackend([TableSpec(n, r, DIM) for n, r in zip(names, ROWS)], SparseOptim(lr=0.0))
    ours = DLRM(emb, NUM_DENSE, DIM, [16], [12], cross=CROSS)
    state = theirs.state_dict()
    dense = {k: v for k, v in state.items() if not k.startswith("sparse_arch.")}
    assert set(dense) == set(ours.dense_state_dict())  # the keys export writes, one to one
    ours.load_dense_state_dict(dense)
    emb.import_tables(
        {
            f"{n}.{field}": state[f"sparse_arch.embedding_bag_collection.embedding_bags.{n}.weight"]
            if field == "weight"
            else torch.zeros(r)
            for n, r in zip(names, ROWS)
            for field in ("weight", "momentum1")
        }
    )
    return theirs, ours


def _batch() -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.randint(0, r, (BATCH,), generator=g) for r in ROWS])
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"C{i + 1}" for i in range(len(ROWS))],
        values=ids,
        lengths=torch.ones(len(ROWS) * BATCH, dtype=torch.int64),
    )
    dense = torch.randn(BATCH, NUM_DENSE, generator=g)
    labels = (torch.rand(BATCH, generator=g) < 0.5).float()
    return dense, sparse, labels


def test_dlrm_dcn_equals_torchrecs_outputs_and_gradients():
    theirs, ours = _pair()
    dense, sparse, labels = _batch()
    # torchrec's forward, with its pooled embeddings kept to read their gradient
    pooled_theirs = theirs.sparse_arch(sparse)
    pooled_theirs.retain_grad()
    logits_theirs = theirs.over_arch(
        theirs.inter_arch(theirs.dense_arch(dense), pooled_theirs)
    ).squeeze(-1)
    torch.testing.assert_close(logits_theirs, theirs(dense, sparse).squeeze(-1), rtol=0, atol=0)
    F.binary_cross_entropy_with_logits(logits_theirs, labels).backward()
    # ours: fbgemm's pooling, then the dense path on a leaf of its values
    pooled_ours = ours.embeddings(sparse).values().detach().requires_grad_()
    logits_ours = ours.dense_forward(dense, pooled_ours)
    F.binary_cross_entropy_with_logits(logits_ours, labels).backward()

    torch.testing.assert_close(pooled_ours.view_as(pooled_theirs), pooled_theirs.detach())
    torch.testing.assert_close(logits_ours, logits_theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pooled_ours.grad.view_as(pooled_theirs), pooled_theirs.grad)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        if not name.startswith("embeddings."):
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-7, msg=name)
    assert sum(n.startswith("inter_arch.crossnet.") for n, _ in ours.named_parameters()) == 9


def test_dense_shapes_hold_the_cross_network():
    """The shapes a checkpoint is checked against: a dot model's state is no DCN model's."""
    dcn = dense_shapes(13, 26, 128, [512, 256], [1024, 1024, 512, 256], CrossShape(3, 512))
    dot = dense_shapes(13, 26, 128, [512, 256], [1024, 1024, 512, 256])
    assert dcn["inter_arch.crossnet.W_kernels.2"] == (27 * 128, 512)
    assert dcn["inter_arch.crossnet.V_kernels.0"] == (512, 27 * 128)
    assert dcn["over_arch.model.0._mlp.0._linear.weight"] == (1024, 27 * 128)
    assert dot["over_arch.model.0._mlp.0._linear.weight"] == (1024, 128 + 27 * 26 // 2)
    dot_state = {k: torch.zeros(s, device="meta") for k, s in dot.items()}
    assert "inter_arch.crossnet" in str(dense_state_problem(dot_state, dcn))


@pytest.mark.parametrize(
    "config, expected",
    [
        ({}, None),  # a checkpoint from before the key: dots
        ({"model.interaction": "dot", "model.dcn_num_layers": 3}, None),
        (
            {"model.interaction": "dcn", "model.dcn_num_layers": 2, "model.dcn_low_rank_dim": 64},
            CrossShape(2, 64),
        ),
    ],
)
def test_cross_shape_of_a_recorded_config(config, expected):
    assert cross_shape(config, "model.") == expected


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model.interaction": "dcn", "model.dcn_num_layers": 2}, "without model.dcn_low_rank_dim"),
        ({"model.interaction": "cross"}, "'cross' is not a valid Interaction"),
    ],
)
def test_cross_shape_of_a_config_that_is_no_models(config, message):
    """ValueError, which the checkpoint checks turn into one line naming meta.json."""
    with pytest.raises(ValueError, match=message):
        cross_shape(config, "model.")


def test_dcn_under_bf16_autocast_stays_near_fp32():
    _, ours = _pair()
    dense, sparse, _ = _batch()
    pooled = ours.embeddings(sparse).values().detach()
    fp32 = ours.dense_forward(dense, pooled)
    ours.precision = ours.precision.bf16
    torch.testing.assert_close(ours.dense_forward(dense, pooled), fp32, rtol=5e-2, atol=5e-2)

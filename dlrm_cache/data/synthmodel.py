"""The planted model of `dlrm-cache synth`: id popularity and the click model.

Each line is ``label \\t I1..I13 \\t C1..C26`` like the real logs.  For feature ``C_j`` with ``n_j``
ids, the id of popularity rank ``r`` is drawn with probability proportional to ``(r + 1) ** -alpha``
(Zipf-like), and is written as a fixed random 32-bit value in 8 hex digits, so hex order says nothing
about popularity.  The click model is logistic::

    logit = bias + sum_i w_i * z_i                               # dense part
                 + sum_j e_j[id_j]                               # one effect per id (empty: its own)
                 + sum_{j<k} <v_j[id_j], v_k[id_k]>              # factorization-machine interactions
                 + cross_scale * x                               # a planted pairwise cross
                 + logit_noise * N(0, 1)                         # unexplained noise
    label ~ Bernoulli(sigmoid(logit))

with ``z_i = std(log1p(max(I_i, 0)))`` (empty ``I_i`` -> 0, then standardized: mean 0, std 1).
The planted cross ``x`` (mean 0, std 1) multiplies two features, by ``cross``:

- ``ids``: ``x = c[id_1, id_2]``, an effect of its own for every pair of (C1, C2) ids, uniform and
  unrelated to either id's other effects: no sum of per-id terms expresses it; a dot product of
  one row per id, as wide as the smaller feature has values (ids and the empty one), does
  (dot-DLRM's dot of two embeddings, exactly where C1 and C2 have at most embedding_dim values);
  where C1 or C2 is multi-hot, the mean over every pair of their ids;
- ``dense``: ``x = z_1 * z_2``, the product of two dense features' values, the kind of cross of
  DCN-v2's synthetic study (Wang et al. 2021): a cross network multiplies its inputs,
  an MLP of ReLUs only approximates a product.

``cross_scale=0``, the default, plants none, and the bytes are those of the generator without it.

The noise-free ``sigmoid(logit)`` is the best possible score from the features, so its AUC against
the drawn labels (the *oracle AUC*, written to ``oracle.json``) is the ceiling for any model.  The
dense transform matches preprocessing, so nothing the oracle uses is lost there (except ids that
preprocessing folds into the rare row).

Multi-hot features (``multi_hot_sizes``) are :mod:`.synthlists`'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .config import CrossKind
from .format import KAGGLE_CARDINALITIES, NUM_DENSE, NUM_SPARSE
from .synthlists import draw_list, list_sizes, mean_pairs, mean_rows, model_ids

_LATENT_DIM = 4
_PILOT_LINES = 20_000  # calibrates the bias and the dense standardization


def table_sizes(cfg: Any) -> list[int]:
    """Rows per categorical feature: the scaled ``kaggle`` preset or an explicit list."""
    card = cfg.cardinalities
    if isinstance(card, str):
        if card != "kaggle":
            raise ValueError(
                f"cardinalities={card!r}: the only preset is 'kaggle' (or give 26 ints)"
            )
        return [
            min(c, max(int(cfg.min_cardinality), math.ceil(c * float(cfg.cardinality_scale))))
            for c in KAGGLE_CARDINALITIES
        ]
    sizes = [int(c) for c in card]
    if len(sizes) != NUM_SPARSE or min(sizes) < 1:
        raise ValueError(f"cardinalities: need {NUM_SPARSE} positive ints, got {sizes}")
    return sizes


@dataclass
class PlantedModel:
    """Everything fixed per dataset: id popularity, hex spellings and the click model."""

    cdfs: list[np.ndarray]  # per feature, cumulative popularity of ranks 0..n-1
    hex_ids: list[pa.Array]  # per feature, 8-hex-digit string of each rank
    effects: list[np.ndarray]  # per feature, n+1 per-id logit effects (index n: the empty value)
    latents: list[np.ndarray]  # per feature, (n+1, _LATENT_DIM) interaction vectors
    dense_mu: np.ndarray  # raw integer feature i is floor(exp(mu_i + sigma_i * z)) - 1 (- shift_i)
    dense_sigma: np.ndarray
    dense_shift: np.ndarray
    dense_w: np.ndarray  # weights of the standardized dense features
    dense_mean: np.ndarray
    dense_std: np.ndarray
    bias: float
    cross_scale: float = 0.0  # std of the planted cross
    cross: CrossKind = CrossKind.ids  # which two features it multiplies
    cross_seed: int = 0
    list_sizes: list[int] = field(default_factory=list)  # per feature, mean ids per sample
    list_lengths: str = "fixed"  # how a multi-hot field's length is drawn (data/synthlists.py)


def pair_effect(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    """The cross's effect of id pairs ``(a, b)`` (indices, the empty value included): a
    splitmix64 hash to a uniform in [-sqrt 3, sqrt 3), mean 0, std 1; no table of all pairs."""
    with np.errstate(over="ignore"):
        x = (a.astype(np.uint64) << np.uint64(32)) ^ b.astype(np.uint64) ^ np.uint64(seed)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) / 2.0**53 * 2.0 - 1.0) * math.sqrt(3.0)


@dataclass
class Chunk:
    label: np.ndarray  # (n,) int8
    dense: np.ndarray  # (n, 13) int64 raw integers
    dense_missing: np.ndarray  # (n, 13) bool
    ranks: np.ndarray  # (n, 26) int32 popularity rank, -1 = empty (or a multi-hot feature)
    score: np.ndarray  # (n,) float64 noise-free logit (the oracle's score)
    # multi-hot features: index -> (offsets [n + 1], popularity ranks)
    lists: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _hex_strings(values: np.ndarray) -> pa.Array:
    """uint32 values -> arrow strings of exactly 8 lowercase hex digits (vectorized)."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    nibbles = (values.astype(np.uint64)[:, None] >> shifts) & np.uint64(15)
    data = digits[nibbles.astype(np.intp)].tobytes()
    offsets = np.arange(len(values) + 1, dtype=np.int32) * 8
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def build_model(cfg: Any, sizes: list[int]) -> PlantedModel:
    rng = np.random.default_rng([int(cfg.seed), 0])
    alpha = float(cfg.zipf_alpha)
    # Per-feature importance, normalized so the summed id effects have std ~ id_effect_scale.
    importance = rng.uniform(0.2, 1.0, NUM_SPARSE)
    importance *= float(cfg.id_effect_scale) / np.sqrt(np.sum(importance**2))
    # FM term: Var(sum over 325 pairs of <v, v'>) ~ 325 * dim * s^4.
    pairs = NUM_SPARSE * (NUM_SPARSE - 1) / 2
    latent_std = (float(cfg.interaction_scale) ** 2 / (pairs * _LATENT_DIM)) ** 0.25
    cdfs, hex_ids, effects, latents = [], [], [], []
    for j, n in enumerate(sizes):
        weights = np.arange(1, n + 1, dtype=np.float64) ** -alpha
        cdf = np.cumsum(weights)
        cdfs.append(cdf / cdf[-1])
        # Distinct random 32-bit ids: hex order is unrelated to popularity.
        hex_ids.append(_hex_strings(rng.choice(1 << 32, size=n, replace=False)))
        effects.append(rng.normal(0.0, importance[j], n + 1))
        latents.append(rng.normal(0.0, latent_std, (n + 1, _LATENT_DIM)))
    model = PlantedModel(
        cdfs=cdfs,
        hex_ids=hex_ids,
        effects=effects,
        latents=latents,
        dense_mu=rng.uniform(0.0, 4.0, NUM_DENSE),
        dense_sigma=rng.uniform(0.5, 1.5, NUM_DENSE),
        dense_shift=np.where(np.arange(NUM_DENSE) == 1, 2, 0),  # I2 has negatives, like Criteo
        dense_w=np.zeros(NUM_DENSE),
        dense_mean=np.zeros(NUM_DENSE),
        dense_std=np.ones(NUM_DENSE),
        bias=0.0,
        cross_scale=float(cfg.cross_scale),
        cross=CrossKind(str(cfg.cross)),
        cross_seed=int(cfg.seed),
        list_sizes=list_sizes(cfg),  # draws nothing: a one-hot model's streams are unchanged
        list_lengths=str(cfg.multi_hot_lengths),
    )
    w = rng.normal(0.0, 1.0, NUM_DENSE)
    model.dense_w = w * float(cfg.dense_scale) / np.linalg.norm(w)
    _calibrate(model, cfg, np.random.default_rng([int(cfg.seed), 1]))
    return model


def _dense_features(model: PlantedModel, dense: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """The dense transform of preprocessing: log1p(max(x, 0)), empty -> 0."""
    return np.where(missing, 0.0, np.log1p(np.maximum(dense, 0)))


def _calibrate(model: PlantedModel, cfg: Any, rng: np.random.Generator) -> None:
    """Standardize the dense features and solve for the bias that gives ``positive_rate``."""
    pilot = sample(model, cfg, rng, _PILOT_LINES, with_bias=False)
    feats = _dense_features(model, pilot.dense, pilot.dense_missing)
    model.dense_mean, model.dense_std = feats.mean(0), feats.std(0) + 1e-6
    pilot = sample(model, cfg, rng, _PILOT_LINES, with_bias=False)
    target = float(cfg.positive_rate)
    noisy = pilot.score + float(cfg.logit_noise) * rng.standard_normal(len(pilot.score))
    lo, hi = -30.0, 30.0
    for _ in range(60):  # bisection: the mean click probability is increasing in the bias
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(sigmoid(noisy + mid)) < target else (lo, mid)
    model.bias = (lo + hi) / 2


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def sample(
    model: PlantedModel, cfg: Any, rng: np.random.Generator, n: int, with_bias: bool = True
) -> Chunk:
    """Draw ``n`` examples: features, noise-free logit and labels."""
    dense_missing = rng.random((n, NUM_DENSE)) < float(cfg.dense_missing_rate)
    z = rng.standard_normal((n, NUM_DENSE))
    dense = (
        np.floor(np.exp(model.dense_mu + model.dense_sigma * z)).astype(np.int64)
        - 1
        - model.dense_shift
    )
    feats = (_dense_features(model, dense, dense_missing) - model.dense_mean) / model.dense_std
    score = feats @ model.dense_w + (model.bias if with_bias else 0.0)

    ranks = np.empty((n, NUM_SPARSE), dtype=np.int32)
    latent_sum = np.zeros((n, _LATENT_DIM))
    latent_sq = np.zeros(n)
    missing_rate = float(cfg.missing_rate)
    crossed: list[tuple[np.ndarray | None, np.ndarray]] = []  # C1's and C2's (offsets, indices)
    lists: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, cdf in enumerate(model.cdfs):
        if model.list_sizes[j] > 1:
            lists[j] = draw_list(rng, cdf, n, model.list_sizes[j], model.list_lengths, missing_rate)
            o, idx = model_ids(*lists[j], len(cdf))  # an empty list: the empty value
            score += mean_rows(o, model.effects[j][idx])
            v = np.stack([mean_rows(o, model.latents[j][idx, d]) for d in range(_LATENT_DIM)], 1)
            ranks[:, j] = -1
            offsets: np.ndarray | None = o
        else:
            r = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(cdf) - 1)
            missing = rng.random(n) < missing_rate
            idx = np.where(missing, len(cdf), r)  # the empty value has its own effect (last entry)
            score += model.effects[j][idx]
            v = model.latents[j][idx]
            ranks[:, j] = np.where(missing, -1, r)
            offsets = None
        latent_sum += v
        latent_sq += np.einsum("nd,nd->n", v, v)
        if j < 2:
            crossed.append((offsets, idx))
    if model.cross_scale:  # drawing nothing: without it, the random streams are as before
        x = feats[:, 0] * feats[:, 1] if model.cross is CrossKind.dense else None
        score += model.cross_scale * (x if x is not None else _cross(crossed, model.cross_seed))
    score += 0.5 * (np.einsum("nd,nd->n", latent_sum, latent_sum) - latent_sq)

    noisy = score + float(cfg.logit_noise) * rng.standard_normal(n)
    label = (rng.random(n) < sigmoid(noisy)).astype(np.int8)
    return Chunk(label, dense, dense_missing, ranks, score, lists)


def _cross(crossed: list[tuple[np.ndarray | None, np.ndarray]], seed: int) -> np.ndarray:
    """The (C1, C2) cross's effect per sample: of the id pair, or the mean over every pair of
    their ids where one of them is multi-hot."""
    (oa, a), (ob, b) = crossed
    if oa is None and ob is None:
        return pair_effect(a, b, seed)
    known = oa if oa is not None else ob
    assert known is not None
    one = np.arange(len(known))  # a one-hot feature's offsets
    return mean_pairs(
        (one if oa is None else oa, a),
        (one if ob is None else ob, b),
        lambda x, y: pair_effect(x, y, seed),
    )

"""Batch-normalised importance weights and rejection by k2 / k3 divergence (verl's rollout correction), by hand;
and the same through the config in the driver's mismatch stage."""

import math

import pytest
import torch

from gyre.algos.mismatch import divergence_filter, importance_weights, normalize_weights
from gyre.training.advantage import correct_mismatch
from tests.training.test_advantage import sample, stage, to_batch

NAN = float("nan")
# delta = log pi_old - log mu: row 0 [0.1, -0.05, 0.3, 0.0] (algorithms.md section 7), row 1 [0.2, 0.2] + a NaN pad.
OLD = torch.tensor([[0.1, -0.05, 0.3, 0.0], [0.2, 0.2, NAN, NAN]], dtype=torch.float64)
MU = torch.zeros(2, 4, dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


def test_token_weights_normalised_over_tokens():
    # Truncated at 1.2: row 0 [e^0.1, e^-0.05, 1.2, 1] = [1.105171, 0.951229, 1.2, 1.0], row 1 [1.2, 1.2].
    # Mean over the 6 tokens: 6.656400 / 6 = 1.109400.
    w = importance_weights(OLD, MU, MASK, "token", 1.2)
    mean = (math.exp(0.1) + math.exp(-0.05) + 1.2 + 1.0 + 1.2 + 1.2) / 6
    assert mean == pytest.approx(1.109400, abs=1e-6)
    got = normalize_weights(w, MASK, "token")
    assert got[0].tolist() == pytest.approx([math.exp(0.1) / mean, math.exp(-0.05) / mean, 1.2 / mean, 1 / mean])
    assert got[1].tolist() == pytest.approx([1.2 / mean, 1.2 / mean, 1.0, 1.0])  # 1.0 off the mask
    assert float(got[MASK > 0].mean()) == pytest.approx(1.0)


def test_row_weights_normalised_over_rows():
    # Geometric: row 0 exp(0.35 / 4) = 1.091442, row 1 exp(0.2) = 1.221403 -> 1.2; the mean over the two
    # rows (each once, however long) 1.145721 -> [0.952625, 1.047375].
    got = normalize_weights(importance_weights(OLD, MU, MASK, "geometric", 1.2), MASK, "geometric")
    row0, row1 = math.exp(0.0875), 1.2
    assert got[:, 0].tolist() == pytest.approx([row0 / ((row0 + row1) / 2), row1 / ((row0 + row1) / 2)])
    assert got[:, 0].tolist() == pytest.approx([0.952625, 1.047375], abs=1e-6)
    # Sequence: exp(0.35) and exp(0.4) are both truncated at 1.2: the mean is 1.2, every weight 1.
    seq = normalize_weights(importance_weights(OLD, MU, MASK, "sequence", 1.2), MASK, "sequence")
    assert seq[MASK > 0].tolist() == pytest.approx([1.0] * 6)


# Per token, k2 = delta^2 / 2 and k3 = e^delta - 1 - delta:
#   row 0 k2 [0.005, 0.00125, 0.045, 0];  k3 [0.0051709, 0.0012294, 0.0498588, 0]  (sum 0.0562591, mean 0.0140648)
#   row 1 k2 [0.02, 0.02];                 k3 [0.0214028, 0.0214028]              (sum 0.0428055, mean 0.0214028)
@pytest.mark.parametrize("kind,level,threshold,keep", [
    ("k2", "token", 0.01, [[1, 1, 0, 1], [0, 0, 0, 0]]),
    ("k3", "token", 0.03, [[1, 1, 0, 1], [1, 1, 0, 0]]),
    ("k3", "sequence_sum", 0.05, [[0, 0, 0, 0], [1, 1, 0, 0]]),
    ("k3", "sequence_mean", 0.015, [[1, 1, 1, 1], [0, 0, 0, 0]]),
    ("k2", "sequence_max", 0.03, [[0, 0, 0, 0], [1, 1, 0, 0]]),
])
def test_divergence_rejection(kind, level, threshold, keep):
    got = divergence_filter(OLD, MU, MASK, kind, level, threshold)
    assert got.tolist() == keep


def test_divergence_rejection_checks_its_threshold():
    with pytest.raises(ValueError, match="threshold must be > 0"):
        divergence_filter(OLD, MU, MASK, "k3", "token", 0.0)
    with pytest.raises(ValueError, match="unknown mismatch divergence 'k1'"):
        divergence_filter(OLD, MU, MASK, "k1", "token", 0.1)


def test_the_driver_stage_rejects_then_normalises_over_what_is_kept():
    cfg, _ = stage("algorithm.mismatch.weight=token", "algorithm.mismatch.normalize_weights=true",
                   "algorithm.mismatch.divergence=k3", "algorithm.mismatch.divergence_level=token",
                   "algorithm.mismatch.divergence_max=0.05")
    batch = to_batch([sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 2)], 0)  # response tokens at positions 2, 3
    batch.old_logprobs = batch.rollout_logprobs.clone()
    batch.old_logprobs[0, 2] += 0.5  # k3 = e^0.5 - 1.5 = 0.148721 > 0.05: rejected
    batch.old_logprobs[0, 3] += 0.1  # k3 0.005171, kept; weight e^0.1 = 1.105171
    keep, metrics = correct_mismatch(batch, cfg.algorithm.mismatch)
    assert keep[:, 2:].tolist() == [[0.0, 1.0], [1.0, 1.0]]
    assert metrics["mismatch/divergence_rejected_frac"] == 0.25 and metrics["mismatch/filtered_frac"] == 0.25
    # Mean weight over the three kept tokens: (1.105171 + 1 + 1) / 3 = 1.035057.
    mean = (math.exp(0.1) + 2) / 3
    assert batch.token_weights[:, 3].tolist() == pytest.approx([math.exp(0.1) / mean, 1 / mean], abs=1e-6)


def test_normalising_needs_weights():
    from gyre.config import ConfigError

    with pytest.raises(ConfigError, match="normalize_weights normalises the importance weights, which are off"):
        stage("algorithm.mismatch.normalize_weights=true")

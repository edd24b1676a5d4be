"""Algorithm maths as pure tensor functions (torch and numpy only; no Ray or transformers).

Shapes use B for samples, T for padded response tokens, G for samples per prompt (the group).
"""

from gyre.algos.advantages import group_normalized_advantages
from gyre.algos.aggregation import LossDenominator, aggregate_loss
from gyre.algos.kl import kl_estimate
from gyre.algos.policy_loss import PolicyLossOutput, ppo_clip_loss
from gyre.algos.stats import masked_mean, masked_sum

__all__ = [
    "LossDenominator", "PolicyLossOutput", "aggregate_loss", "group_normalized_advantages", "kl_estimate",
    "masked_mean", "masked_sum", "ppo_clip_loss",
]

"""A scalar reward model built from a local checkpoint: one score per sample, at the last real token."""

import torch

from gyre.config.reward_schema import RewardModelConfig
from gyre.rewards.base import RewardRequest
from gyre.rewards.reward_model import RewardModel


def test_reward_model_scores_the_last_real_token(tiny_model_dir):
    rm = RewardModel(RewardModelConfig(path=str(tiny_model_dir), micro_batch_size=2), torch.device("cpu"))
    requests = [RewardRequest("12", "", "1+11="), RewardRequest("a much longer answer", "", "1+11="),
                RewardRequest("12", "", "1+11=")]
    scores = [r.score for r in rm.score(requests)]
    assert all(isinstance(s, float) for s in scores) and abs(scores[0] - scores[2]) < 1e-5
    # Padding does not change a row's score: alone it scores the same as in a padded batch.
    alone = rm.score(requests[:1])[0].score
    assert abs(alone - scores[0]) < 1e-5 and scores[0] != scores[1]

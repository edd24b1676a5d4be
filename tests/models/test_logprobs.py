import math

import pytest
import torch

from gyre.models.logprobs import entropy_from_logits, token_logprobs


def test_token_logprobs_hand_computed():
    # logits [0, ln 3] -> probs [1/4, 3/4]; at temperature 2: logits [0, ln3/2] -> [1/(1+sqrt3), sqrt3/(1+sqrt3)]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    s3 = math.sqrt(3.0)
    assert token_logprobs(logits, torch.tensor([[0]]), temperature=2.0).item() == pytest.approx(math.log(1 / (1 + s3)))


def test_entropy_hand_computed():
    # probs [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert entropy_from_logits(logits).item() == pytest.approx(0.562335, abs=1e-5)
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))

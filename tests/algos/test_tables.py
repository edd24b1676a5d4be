"""The name tables of gyre.algos: lookup errors, and that each row wires its knobs to its function."""

import math
from typing import get_args

import pytest
import torch

from gyre.algos import loss_table
from gyre.algos.aggregation import AGGREGATIONS, AggMode
from gyre.algos.baselines import BaselineContext
from gyre.algos.estimator_table import ESTIMATORS, AdvantageSpec, GaeKnobs, PassAtKKnobs
from gyre.algos.loss_table import POLICY_LOSSES, PolicyLossSpec
from gyre.algos.mismatch import DIVERGENCE_LEVELS, DIVERGENCES
from gyre.algos.policy_loss import PolicyLossInputs
from gyre.algos.specs import Divergence, DivergenceLevel
from gyre.algos.tables import Registry


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError) as err:
        POLICY_LOSSES.get("ppo2")
    assert str(err.value) == ("unknown policy loss 'ppo2'; valid names: ppo, vanilla, tis, topr, cispo, kimi15, "
                              "decoupled_ppo, clip_cov, kl_cov, gmpo, sapo")
    with pytest.raises(ValueError, match=r"^unknown advantage estimator 'grpo'; valid names: reinforce, rloo, "
                                         r"group_centred_batch_std, gae, step_returns, rebn, gigpo, chunk_returns, "
                                         r"remax, opo, pass_at_k, gpg$"):
        ESTIMATORS.get("grpo")
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'; valid names: token-mean, "
                                         "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm, token-sum"):
        AGGREGATIONS.get("sum")
    assert DIVERGENCES.names == ("k2", "k3")
    assert DIVERGENCE_LEVELS.names == ("token", "sequence_sum", "sequence_mean", "sequence_max")
    with pytest.raises(ValueError, match="unknown thing None; valid names: a"):
        Registry("thing", {"a": 1}).get(None)


# One token: rho = pi / pi_old = 1.5, A = +1, pi_old / mu = 2, a sample with reward 0 (TOPR's negative set).
# Every knob is off its default, so a row that drops or swaps one gets a different number.
SHARED = {"clip_low": 0.1, "clip_high": 0.3}
KNOBS = {"ppo": loss_table.PpoKnobs(dual_clip_c=None), "tis": loss_table.TisKnobs(high=0.9),
         "topr": loss_table.ToprKnobs(negative_weight=0.5), "cispo": loss_table.CispoKnobs(low=0.2, high=0.25),
         "kimi15": loss_table.Kimi15Knobs(tau=0.4), "decoupled_ppo": loss_table.DecoupledPpoKnobs(behaviour_cap=1.5),
         "clip_cov": loss_table.ClipCovKnobs(), "kl_cov": loss_table.KlCovKnobs(coef=0.7),
         "gmpo": loss_table.GmpoKnobs(clip_high=0.3), "sapo": loss_table.SapoKnobs(tau_pos=2.0)}


def spec_of(name: str) -> PolicyLossSpec:
    return PolicyLossSpec(variant=name, knobs=KNOBS.get(name), **SHARED)
LN = math.log(1.5)


@pytest.mark.parametrize("name,expected", [
    ("ppo", -1.3),                         # -min(1.5, clip(1.5, 0.9, 1.3)) A
    ("vanilla", -LN),                      # -A log pi
    ("tis", -0.9 * LN),                    # -clip(rho, 0, 0.9) A log pi
    ("topr", -0.5 * 1.0 * LN),             # negative set: -w- clip(rho, 0, 1) A log pi
    ("cispo", -1.25 * LN),                 # -clip(rho, 0.8, 1.25) A log pi
    ("kimi15", -LN + 0.5 * 0.4 * LN ** 2),  # -A log pi + tau/2 (log rho)^2
    ("decoupled_ppo", -1.5 * 1.3),         # min(pi_old / mu = 2, cap 1.5) x the PPO term -1.3
    ("clip_cov", -1.3),                    # PPO's clip; a lone token has covariance 0, outside the band
    ("kl_cov", -1.5 + 0.7 * LN),           # the one token is the top k: -rho A + beta |log rho|
    ("gmpo", -math.exp(0.3)),              # log rho 0.405 clipped at 0.3 (A > 0): -A exp(0.3)
    ("sapo", -2 / (1 + math.exp(-1.0))),   # -sigmoid(tau (rho - 1)) 4 / tau A, tau 2: -2 sigmoid(1)
])
def test_each_policy_loss_row_uses_its_knobs(name, expected):
    inputs = PolicyLossInputs(logprobs=torch.tensor([[LN]], requires_grad=True), old_logprobs=torch.zeros(1, 1),
                              advantages=torch.ones(1, 1), mask=torch.ones(1, 1),
                              behaviour_logprobs=torch.tensor([[math.log(0.5)]]), scores=torch.tensor([0.0]))
    spec = spec_of(name)
    out = POLICY_LOSSES.get(name).loss(inputs, spec, spec.knobs)
    assert out.token_loss.item() == pytest.approx(expected, abs=1e-6)


def test_topr_row_needs_scores():
    x = PolicyLossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                         torch.zeros(1, 1), scores=None)
    with pytest.raises(ValueError, match="topr needs batch.scores"):
        POLICY_LOSSES.get("topr").loss(x, spec_of("topr"), KNOBS["topr"])


@pytest.mark.parametrize("name,expected", [
    ("reinforce", [[0.70711, -0.70711], [0.0, 0.0]]),  # group mean / group std (the scopes below)
    ("gae", [[0.70711, -0.70711], [0.0, 0.0]]),        # same response-level stage as reinforce
    ("rloo", [[1.0, -1.0], [0.0, 0.0]]),               # r_i - mean of the others
    # centred [0.5, -0.5, 0, 0], batch std (ddof 1) sqrt(0.5 / 3) = 0.40825
    ("group_centred_batch_std", [[1.22474, -1.22474], [0.0, 0.0]]),
    ("remax", [[0.5, -0.5], [0.0, 0.0]]),              # r - greedy reward [0.5, 1]
    ("opo", [[0.75, -0.25], [0.0, 0.0]]),              # baseline (1 x 1 + 3 x 0) / (1 + 3) = 0.25
    ("pass_at_k", [[1.0, -1.0], [0.0, 0.0]]),          # k = 1: group mean over the population std 0.5
    ("gpg", [[1.41421, -1.41421], [0.0, 0.0]]),        # the group/group scopes x alpha = 4 samples / 2 varied
])
def test_each_estimator_baseline(name, expected):
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    context = BaselineContext(lengths=torch.tensor([[1, 3], [2, 2]]), greedy=torch.tensor([0.5, 1.0]))
    spec = AdvantageSpec(estimator=name, knobs=PassAtKKnobs(k=1) if name == "pass_at_k" else None)
    got = ESTIMATORS.get(name).baseline(rewards, spec, context=context)
    assert got.tolist() == [pytest.approx(row, abs=1e-4) for row in expected]


def test_context_baselines_say_what_they_miss():
    rewards = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="estimator remax needs a BaselineContext with greedy"):
        ESTIMATORS.get("remax").baseline(rewards, AdvantageSpec(estimator="remax"), context=BaselineContext())
    with pytest.raises(ValueError, match="estimator opo needs a BaselineContext with lengths"):
        ESTIMATORS.get("opo").baseline(rewards, AdvantageSpec(estimator="opo"))


def test_name_tables_match_the_types_the_config_reads():
    assert AGGREGATIONS.names == AggMode.__args__
    assert DIVERGENCES.names == get_args(Divergence) and DIVERGENCE_LEVELS.names == get_args(DivergenceLevel)


def test_token_estimators_returns_and_gae():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lambda 0.95 -> GAE [0.46575, 0.385, 0.3], returns A + V.
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, returns = ESTIMATORS.get("reinforce").advantages(rewards, None, mask, AdvantageSpec(gamma=1.0))
    assert adv.tolist() == [[1.0, 1.0, 1.0]] and returns is None
    spec = AdvantageSpec(estimator="gae", gamma=1.0, knobs=GaeKnobs(lam=0.95))
    adv, returns = ESTIMATORS.get("gae").advantages(rewards, values, mask, spec)
    assert adv[0].tolist() == pytest.approx([0.46575, 0.385, 0.3], abs=1e-6)
    assert returns[0].tolist() == pytest.approx([0.96575, 0.985, 1.0], abs=1e-6)
    assert [n for n in ESTIMATORS.names if ESTIMATORS.get(n).critic] == ["gae"]

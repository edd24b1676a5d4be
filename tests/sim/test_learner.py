"""A simulated training step: the real learner's passes over the real micro-batches, computed by hand."""

import pytest

from gyre.config import load_config
from gyre.config.catalog import MODELS, device_class
from gyre.engines.specs import MemoryLevers
from gyre.sim.cost import CostModel
from gyre.sim.learner import Cut, SimLearner, sim_learner
from gyre.training.plan import StepPasses

BASE = ["model.path=m", "data.train_files=[t.jsonl]", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8"]
ONLY_UPDATE = StepPasses(False, False, False, False, 0, 1, False)


def learner(*overrides, devices=8):
    return sim_learner(load_config(None, BASE + list(overrides)), devices, MODELS["7b"])


def test_grpo_without_kl_on_8_h800_is_one_forward_and_backward_of_its_rows():
    # 64 rows of 1,000 tokens, packed, on 8 ranks: 8,000 tokens a rank. One optimizer step (no mini-batches)
    # and no KL term: no pi_old pass (the update's own forward gives it), no reference: 6 P T =
    # 6 x 7.6e9 x 8,000 = 3.648e14 FLOPs, at 989 TFLOP/s x 0.4 MFU = 0.92214 s, plus the step's 0.5 s.
    sim = learner("algorithm.preset=grpo", "algorithm.kl.loss_coef=0", "policy.remove_padding=pack")
    assert sim.step_flops([1000] * 64, step=1) == pytest.approx(3.648e14)
    cost = CostModel(device_class("h800"), MODELS["7b"])
    assert cost.train_compute_s(sim.step_flops([1000] * 64, step=1)) == pytest.approx(0.5 + 3.648e14 / 395.6e12)
    assert 0.5 + 3.648e14 / 395.6e12 == pytest.approx(1.42214, abs=1e-5)
    # with its KL term (grpo's default): the reference's forward too, 2 P T more: 8 P T
    kl = learner("algorithm.preset=grpo", "policy.remove_padding=pack")
    assert kl.step_flops([1000] * 64, step=1) == pytest.approx(8 * 7.6e9 * 8000)


def test_micro_batches_are_the_trainers_rows_cut_or_token_budget():
    lengths = [100, 90, 50, 40, 10, 5]
    one_rank = dict(params=1.0, ranks=1, rows=2)
    # sort: longest first, two rows each: (100, 90) (50, 40) (10, 5) padded: 200 + 100 + 20
    assert Cut(**one_rank, levers=MemoryLevers(remove_padding="sort")).busiest(lengths) == 320
    # pack: no padding at all, however cut
    assert Cut(**one_rank, levers=MemoryLevers(remove_padding="pack")).busiest(lengths) == 295
    # sort under a 200-token budget (padding counted): (100, 90) = 2 x 100; then 50, 40, 10, 5 = 4 x 50
    assert Cut(**one_rank, levers=MemoryLevers(200, "sort")).busiest(lengths) == 400
    # none: consecutive rows as they come, padded: (100, 90) (50, 40) (10, 5) here, (5, 100) (10, 90) ... reversed
    assert Cut(**one_rank).busiest(lengths) == 320
    assert Cut(**one_rank).busiest([5, 100, 10, 90, 40, 50]) == 200 + 180 + 100


def test_a_pass_takes_its_busiest_ranks_time():
    cut = Cut(1.0, ranks=2, rows=8, levers=MemoryLevers(remove_padding="pack"))
    # longest first to the least loaded rank, equal counts: 100 -> r0, 90 -> r1, 50 -> r1, 40 -> r0: 140 each
    assert cut.busiest([100, 90, 50, 40]) == 140
    # 100 -> r0, 10 -> r1, 10 -> r1 (full), 10 -> r0: 110 and 20; the step waits for 110, not the mean 65
    assert cut.busiest([100, 10, 10, 10]) == 110
    # rows that do not divide over the ranks: counts within one of each other (3 and 2): 100 + 10 + 10
    assert cut.busiest([100, 10, 10, 10, 10]) == 120


def test_a_critic_scores_and_trains_with_its_own_model_and_the_policy_waits_for_its_warmup():
    sim = learner("algorithm.advantage.estimator=gae", "policy.epochs=2", "algorithm.kl.loss_coef=0",
                  "policy.remove_padding=pack", "critic.remove_padding=pack", "algorithm.critic.warmup=1")
    policy, critic = 7.6e9, 7.6e9 - 152_064 * 3584  # the critic's backbone has a value head, not the LM head
    assert sim.critic.params == pytest.approx(critic)
    t = 8 * 1000  # tokens a rank, every pass
    # two epochs make two optimizer steps: pi_old recomputed (2 P T), the critic's values (2 Pc T); each epoch
    # 6 Pc T for the critic, and from step 2 (after the warm-up) 6 P T for the policy
    scoring = 2 * policy * t + 2 * critic * t
    assert sim.step_flops([1000] * 64, step=1) == pytest.approx(scoring + 2 * 6 * critic * t)
    assert sim.step_flops([1000] * 64, step=2) == pytest.approx(scoring + 2 * 6 * critic * t + 2 * 6 * policy * t)


def test_mini_batches_are_each_an_optimizer_step_the_ranks_meet_at():
    # 4 rows over 2 ranks in two mini-batches of 2: each mini-batch's rows are one a rank, so each step costs
    # its longer row; the shuffle decides the pairs (minibatch_rows, the learner's seeded permutation).
    from gyre.training.plan import minibatch_rows

    sim = SimLearner(ONLY_UPDATE, Cut(1.0, 2, 8, MemoryLevers(remove_padding="pack")), mini_batch_size=2,
                     rollout_batch=4, seed=7)
    lengths = [400, 300, 200, 100]
    pairs = [[lengths[i] for i in rows.tolist()] for rows in minibatch_rows(4, 2, 1, 7, 3)]
    assert sim.step_flops(lengths, step=3) == pytest.approx(2 * 3 * sum(max(p) for p in pairs))
    assert 2 * 3 * 500 <= sim.step_flops(lengths, step=3) <= 2 * 3 * 700  # (400 or 300) + (200 or 100 or ...)


def test_fsdp2_ranks_cut_as_many_micro_batches_as_the_busiest():
    # rank shares [100, 1] and [90, 2] balanced: 100 -> r0, 90 -> r1, 2 -> r1 (90 < 100), 1 -> r0. With
    # micro-batches of one row each rank runs two: no change. With a 200-token budget, r0 packs (100, 1) in one
    # and r1 (90, 2) in one too; padded (sort) r0 = 2 x 100 = 200 fits, r1 = 2 x 90 = 180 fits: 200.
    cut = Cut(1.0, 2, 1, MemoryLevers(200, "sort"), fsdp=True)
    assert cut.busiest([100, 90, 2, 1]) == 200
    # a 150-token budget splits r0's pair (2 x 100 > 150) into two; r1 (180 > 150) too: both 101 / 92
    assert Cut(1.0, 2, 1, MemoryLevers(150, "sort"), fsdp=True).busiest([100, 90, 2, 1]) == 101

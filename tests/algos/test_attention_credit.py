import pytest
import torch

from gyre.algos.attention_credit import (
    CreditSpec,
    apply_credit,
    coupled_scales,
    credit_scales,
    fai,
    head_spans,
    middle_third_layers,
    random_scales,
    split_heads,
    top_quantile,
    waad,
    waad_jumps,
)


def test_the_reference_worked_example():
    # Delta = [0.1, 0.9, 0.3, 0.7, 0.2], q = 0.4: ceil(2) = 2 tokens (0.9 and 0.7) get gamma 1.5.
    spec = CreditSpec(strategy="local_chunk")
    chosen = top_quantile(torch.tensor([0.1, 0.9, 0.3, 0.7, 0.2]), spec.top_q)
    gamma = 1 + (spec.gamma_amp - 1) * chosen.float()
    assert gamma.tolist() == [1.0, 1.5, 1.0, 1.5, 1.0]
    assert apply_credit(torch.full((5,), 0.8), gamma).tolist() == pytest.approx([0.8, 1.2, 0.8, 1.2, 0.8])
    assert apply_credit(torch.full((5,), -0.8), gamma).tolist() == pytest.approx([-0.8] * 5)


def test_local_chunk_selects_the_largest_waad_jumps():
    # WAAD [0, 0.1, 1.0, 0.7, 1.4, 1.6] -> Delta [0.1, 0.9, 0.3, 0.7, 0.2, 0]; ceil(0.4 * 6) = 3: 0.9, 0.7, 0.3.
    w = torch.tensor([0.0, 0.1, 1.0, 0.7, 1.4, 1.6])
    assert waad_jumps(w).tolist() == pytest.approx([0.1, 0.9, 0.3, 0.7, 0.2, 0.0])
    assert credit_scales(CreditSpec(strategy="local_chunk"), 6, w=w).tolist() == [1, 1.5, 1.5, 1.5, 1, 1]


def test_middle_third_layers():
    assert middle_third_layers(12, 5) == [4, 5, 6, 7, 8]
    assert middle_third_layers(28, 5) == [9, 11, 14, 16, 18]  # 9 + i * 9/4, rounded
    assert middle_third_layers(2, 5) == [0, 1]


def test_head_span_waad_and_fai_by_hand():
    # Two heads over 3 tokens; rows are causal attention distributions.
    near = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0.5, 0.5]])  # attends to itself (mostly)
    far = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]])  # always to token 0
    attn = torch.stack([near, far])
    rows = torch.tensor([False, True, True])  # the response is tokens 1 and 2
    # span near: row 1: 0; row 2: 0.5 * 1 = 0.5 -> 0.25. far: row 1: 1; row 2: 2 -> 1.5.
    assert head_spans(attn, rows).tolist() == pytest.approx([0.25, 1.5])
    local, glob = split_heads(head_spans(attn, rows), 0.3)  # ceil(0.6) = 1 head each
    assert (local.tolist(), glob.tolist()) == ([0], [1])
    # WAAD with W = 1 on far: row t sums min(t - 0, 1) = [0, 1, 1].
    assert waad(far, 1).tolist() == [0.0, 1.0, 1.0]
    # FAI with near 1, far 1: s = 0 sees t = 1 (A = 1); s = 1 sees t = 2 (A = 0); s = 2 nothing -> 0.
    assert fai(far, 1, 1).tolist() == [1.0, 0.0, 0.0]
    # near 1, far 2: s = 0 averages t = 1, 2 of `near`: (0 + 0) / 2; s = 1: t = 2 -> 0.5.
    assert fai(near, 1, 2).tolist() == [0.0, 0.5, 0.0]


def test_coupled_moves_alpha_of_a_dominated_anchor_back_to_its_waad_peak():
    spec = CreditSpec(strategy="coupled", top_q=0.4, backalloc_k=2, alpha=0.5, tau_waad=2.0, tau_delta=1.0)
    # 5 tokens; ceil(0.4 * 5) = 2 anchors by FAI: tokens 3 and 1.
    f = torch.tensor([0.0, 0.8, 0.1, 0.9, 0.2])
    w = torch.tensor([0.5, 3.0, 4.5, 1.0, 1.2])
    # Delta = [2.5, 1.5, 3.5, 0.2, 0]. Token 3: WAAD 1.0 <= 2 and max(Delta_1, Delta_2) = 3.5 >= 1:
    # dominated; it keeps 0.25 and its WAAD peak in [1, 2] (token 2, 4.5) gets 0.25. Token 1: WAAD 3.0 > 2:
    # a plain anchor, 1.5.
    assert coupled_scales(w, f, spec).tolist() == pytest.approx([1.0, 1.5, 1.25, 1.25, 1.0])
    # With the thresholds out of reach nothing is dominated: the global-anchor scales.
    strict = CreditSpec(strategy="coupled", tau_waad=0.0)
    assert coupled_scales(w, f, strict).tolist() == credit_scales(CreditSpec(strategy="global_anchor"), 5, f=f).tolist()


def test_random_and_entropy_baselines():
    spec = CreditSpec(strategy="entropy", top_q=0.5)
    assert credit_scales(spec, 4, entropy=torch.tensor([0.1, 2.0, 0.3, 1.0])).tolist() == [1, 1.5, 1, 1.5]
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    rand = CreditSpec(strategy="random", top_q=0.5)
    a, b = credit_scales(rand, 10, generator=g1), credit_scales(rand, 10, generator=g2)
    assert a.tolist() == b.tolist() and int((a > 1).sum()) == 5
    assert credit_scales(CreditSpec(), 3).tolist() == [1.0, 1.0, 1.0]


def test_random_scales_pick_a_share_of_each_rows_tokens():
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]])
    gamma = random_scales(mask, CreditSpec(strategy="random", top_q=0.5), torch.Generator().manual_seed(0))
    assert (gamma[mask == 0] == 1).all()
    assert int((gamma[0] > 1).sum()) == 2 and int((gamma[1] > 1).sum()) == 1  # ceil(0.5 n) per row

"""The attention pass of attention-based credit on a real tiny model: its hooks read the same maps as
transformers' output_attentions, the model's kernel is restored, and only response tokens get a scale."""

import torch

from gyre.algos.attention_credit import CreditSpec, credit_scales, middle_third_layers, token_metrics
from gyre.engines.attention import attention_credit_scales
from gyre.engines.forward import ForwardContext
from gyre.models.loading import load_causal_lm
from gyre.types import TrainBatch


def test_scales_match_the_maps_of_output_attentions(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, "float32", False, "cpu", "sdpa")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 90, (2, 16), generator=g)
    attention = torch.ones(2, 16, dtype=torch.long)
    attention[1, 12:] = 0  # row 1 is right-padded
    response = torch.zeros(2, 16)
    response[:, 6:] = 1
    response[1, 12:] = 0
    batch = TrainBatch(ids, attention, response, torch.zeros(2, 16), torch.zeros(2, 16))
    spec = CreditSpec(strategy="coupled", fai_near=2, fai_far=6, tau_waad=3.0)
    gamma = attention_credit_scales(model, batch, ForwardContext(torch.device("cpu")), spec, 1.0, [torch.arange(2)])
    assert model.config._attn_implementation == "sdpa"  # restored after the eager pass
    assert (gamma[response == 0] == 1).all() and (gamma[response > 0] > 1).any()
    # The same scales from transformers' own attention maps (eager, output_attentions) of row 1 alone.
    reference = load_causal_lm(tiny_model_dir, "float32", False, "cpu", "eager")
    with torch.no_grad():
        maps = reference(input_ids=ids[1:, :12], output_attentions=True).attentions
    layers = middle_third_layers(len(maps), spec.layers)
    attn = torch.cat([maps[i][0] for i in layers])
    rows = response[1, :12] > 0
    w, f = token_metrics(attn, rows, spec)
    expected = credit_scales(spec, int(rows.sum()), w[rows], f[rows])
    assert torch.allclose(gamma[1, 6:12], expected)

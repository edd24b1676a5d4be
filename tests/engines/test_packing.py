"""Packed micro-batches under flex attention: a block-sparse mask with the tiles ``create_block_mask`` finds,
that gives a real tiny model the padded rows' log-probs; and which kernel a packing role loads."""

import pytest
import torch

from gyre.data.batching import collate
from gyre.engines.forward import ForwardContext, sequence_logprobs
from gyre.engines.pack_attention import packing_attention, role_attention
from gyre.engines.packing import RowLayout, flex_block_mask, takes_dense_pack_mask
from gyre.engines.specs import MemoryLevers
from gyre.models.loading import load_causal_lm

CPU = torch.device("cpu")


def test_flex_block_mask_hand_computed():
    """Rows of 8 and 4 tokens in tiles of 4: tiles 0 and 1 hold row 0, tile 2 row 1. Tile (1, 0) is whole
    (row 0's second half sees all its first half), the diagonal tiles are causal (partial), and tile 2
    sees nothing of tiles 0 and 1: skipped, never computed."""
    mask = flex_block_mask(torch.tensor([8, 4]), CPU, block=4)
    assert mask.shape == (1, 1, 12, 12)
    assert mask.to_dense()[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert mask.full_kv_num_blocks[0, 0].tolist() == [0, 1, 0]
    assert mask.kv_num_blocks[0, 0].tolist() == [1, 1, 1]  # partial: the diagonal only
    # A row that straddles tiles: [6, 2] -> tile 1 holds row 0's last two tokens and row 1, so tile (1, 0)
    # is partial, not full.
    straddle = flex_block_mask(torch.tensor([6, 2]), CPU, block=4)
    assert straddle.to_dense()[0, 0].tolist() == [[1, 0], [1, 1]]
    assert straddle.full_kv_num_blocks[0, 0].tolist() == [0, 0]
    # The mask inside partial tiles is the block-diagonal causal one.
    q, kv = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    allowed = straddle.mask_mod(0, 0, q, kv).int().tolist()
    assert allowed[5] == [1, 1, 1, 1, 1, 1, 0, 0] and allowed[7] == [0, 0, 0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("lengths", [[5, 1, 9, 3, 12], [1], [4, 4, 4, 4], [3, 0, 5], [17, 2, 2, 30, 1, 1, 1],
                                     [130, 40, 90, 1]])
@pytest.mark.parametrize("block", [1, 4, 8, 128])
def test_flex_block_mask_lists_the_tiles_create_block_mask_finds(lengths, block):
    """From the row lengths, O(tiles^2), the tiles torch's create_block_mask finds by evaluating the
    same-row-and-causal mask on all N^2 pairs, in the same order (so the kernels see the same mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    n = len(row)
    want = create_block_mask(lambda b, h, q, kv: (row[q] == row[kv]) & (q >= kv), 1, None, n, n, device="cpu",
                             BLOCK_SIZE=block)
    got = flex_block_mask(torch.tensor(lengths), CPU, block)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.seq_lengths == want.seq_lengths == (n, n) and got.BLOCK_SIZE == want.BLOCK_SIZE


def test_packed_flex_forward_gives_the_padded_logprobs(tiny_model_dir, monkeypatch):
    """A packed micro-batch of 261 tokens (3 tiles of 128; the third sees nothing of the first) under flex
    attention computes each row's padded log-probs (sdpa, same weights). gyre passes its own BlockMask:
    transformers, which would derive one from the position ids, is not asked to build any, and the
    micro-batch is not capped like the dense mask's. One packed shape only: flex runs compiled, and torch
    2.13's CPU template fails to compile a second shape (dynamic shapes), one reason CPU runs refuse flex."""
    import transformers.masking_utils as masking

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 90, (n,), generator=g).tolist() for n in (100, 20, 60, 1)]
    responses = [torch.randint(4, 90, (n,), generator=g).tolist() for n in (30, 20, 30, 0)]
    batch = collate(prompts, responses, pad_id=0, advantages=[1.0] * 4)
    with torch.no_grad():
        padded = sequence_logprobs(load_causal_lm(tiny_model_dir, attn_implementation="sdpa"), batch,
                                   ForwardContext(CPU), 0.8)[0]
    flex = load_causal_lm(tiny_model_dir, attn_implementation="flex_attention")
    assert not takes_dense_pack_mask(flex)
    inputs = RowLayout.of(batch, packed=True).model_inputs(batch.input_ids, "flex_attention")
    mask = inputs["attention_mask"]
    assert mask.shape == (1, 1, 261, 261) and mask.to_dense()[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]

    def refuse(*args, **kwargs):
        raise AssertionError("transformers built its own flex mask")

    monkeypatch.setitem(masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "flex_attention", refuse)
    with torch.no_grad():
        packed = sequence_logprobs(flex, batch, ForwardContext(CPU, levers=MemoryLevers(remove_padding="pack")),
                                   0.8)[0]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    assert (packed[batch.attention_mask.bool()][1:] != 0).any()


def test_a_packing_role_on_gpus_never_gets_the_dense_mask_by_default():
    """model.attn_implementation unset: packed on CUDA -> flash_attention_2 when flash-attn imports, else
    flex_attention (hybrid policy: transformers' sdpa, flex would compile every decoding shape); not packed,
    or on CPU -> transformers' choice; set -> kept."""
    assert packing_attention(None, "cuda", True, flash_attn=True) == "flash_attention_2"
    assert packing_attention(None, "cuda", True, flash_attn=False) == "flex_attention"
    assert packing_attention(None, "cuda", True, flash_attn=False, samples=True) is None
    assert packing_attention(None, "cuda", True, flash_attn=True, samples=True) == "flash_attention_2"
    assert packing_attention(None, "cuda", False, flash_attn=True) is None
    assert packing_attention(None, "cpu", True, flash_attn=True) is None
    assert packing_attention("sdpa", "cuda", True, flash_attn=True) == "sdpa"
    assert packing_attention("flex_attention", "cpu", True, flash_attn=False) == "flex_attention"
    assert role_attention(None, "cpu", True) is None and role_attention("eager", "cuda", True) == "eager"

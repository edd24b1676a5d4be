"""Weight channels (gyre.cluster.channel) on gloo: members on threads of this process, each its own group."""

import threading
import time

import pytest
import torch

from gyre.cluster.channel import ChannelAborted, ChannelMember, ChannelWeights, Sender
from gyre.cluster.weights import WeightManifest, block_checksum, bucket_checksum, bucket_views, stage_buckets

CPU = torch.device("cpu")


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "layer.bias": torch.randn(3, generator=g),  # 12 bytes: the next tensor starts aligned at 16
            "steps": torch.tensor(7, dtype=torch.int64), "mask": torch.tensor([True, False, True]),
            "head.weight": torch.randn(64, 300, generator=g)}


def _receive(manifest: WeightManifest, spec, ranks, out: dict, errors: dict, members: dict | None = None) -> list:
    members = {} if members is None else members

    def run(rank: int) -> None:
        member = members.setdefault(rank, ChannelMember(CPU))  # an engine keeps its membership
        try:
            out[rank] = member.receive(ChannelWeights(manifest, spec), rank)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    return threads


def test_every_engine_receives_the_exact_tensors_across_buckets():
    state = _state()
    sender = Sender(CPU)
    manifest = sender.stage(state.items(), version=3, bucket_bytes=40_000)  # embed 38400 B, head 76800 B
    assert len(manifest.sizes) == 2 and all(m.offset % 8 == 0 for m in manifest.metas)
    spec = sender.member.host(3, "gloo", 30)
    out, errors, members = {}, {}, {}
    threads = _receive(manifest, spec, (1, 2), out, errors, members)
    assert sender.send(spec, 3) == manifest.nbytes
    for t in threads:
        t.join(30)
    assert not errors
    for rank in (1, 2):
        assert set(out[rank]) == set(state)
        for name, t in state.items():
            assert out[rank][name].dtype == t.dtype and torch.equal(out[rank][name], t), (rank, name)
    # The same group carries the next version (built once per generation).
    manifest = sender.stage(((k, v + 1 if v.is_floating_point() else v) for k, v in state.items()), version=4,
                            bucket_bytes=40_000)
    threads = _receive(manifest, spec, (1, 2), out, errors, members)
    sender.send(spec, 4)
    for t in threads:
        t.join(30)
    assert not errors and torch.equal(out[2]["layer.bias"], state["layer.bias"] + 1)


def test_a_bucket_of_another_version_is_refused_naming_both():
    sender = Sender(CPU)
    staged = sender.stage({"w": torch.ones(4)}.items(), version=5)
    spec = sender.member.host(2, "gloo", 30)
    out, errors = {}, {}
    expected = WeightManifest(6, staged.metas, staged.sizes, staged.checksums)  # the engine was told version 6
    threads = _receive(expected, spec, (1,), out, errors)
    sender.send(spec, 5)
    threads[0].join(30)
    assert "bucket 0 of version 5" in str(errors[1]) and "version 6" in str(errors[1])


def test_a_corrupt_bucket_is_refused():
    sender = Sender(CPU)
    manifest = sender.stage({"w": torch.ones(4)}.items(), version=1)
    spec = sender.member.host(2, "gloo", 30)
    out, errors = {}, {}
    threads = _receive(manifest, spec, (1,), out, errors)
    bucket = sender._staged[1][0][0]
    member, deadline = sender.member, time.monotonic() + 30
    member._join(spec, 0, deadline)
    header = torch.tensor([[1, 0, bucket.numel(), bucket_checksum(bucket)]], dtype=torch.int64)
    member._broadcast(header, spec, deadline)
    bucket[0] ^= 1  # a bit flipped after the checksum was taken
    member._broadcast(bucket, spec, deadline)
    threads[0].join(30)
    assert "corrupt" in str(errors[1])


def test_an_aborted_generation_frees_a_waiting_engine_and_is_not_reused():
    sender = Sender(CPU)
    manifest = sender.stage({"w": torch.ones(4)}.items(), version=1)
    spec = sender.member.host(2, "gloo", 30)
    out, errors, members = {}, {}, {}
    threads = _receive(manifest, spec, (1,), out, errors, members)
    # The sender joins and sends the headers, then stalls (as if its peer had died): the engine waits for
    # the bucket until the driver aborts the generation.
    sender.member._join(spec, 0, time.monotonic() + 30)
    bucket = sender._staged[1][0][0]
    sender.member._broadcast(torch.tensor([[1, 0, bucket.numel(), bucket_checksum(bucket)]]), spec,
                             time.monotonic() + 30)
    time.sleep(0.5)
    t0 = time.monotonic()
    members[1].abort(spec.generation)
    threads[0].join(10)
    assert isinstance(errors[1], ChannelAborted) and time.monotonic() - t0 < 2
    with pytest.raises(ChannelAborted, match="generation 0 was aborted"):
        members[1].receive(ChannelWeights(manifest, spec), 1)
    # The next generation is a fresh group with the same members.
    renewed = spec.renewed()
    out, errors = {}, {}
    member = members[1]
    thread = threading.Thread(target=lambda: out.setdefault(1, member.receive(ChannelWeights(manifest, renewed), 1)))
    thread.start()
    sender.send(renewed, 1)
    thread.join(30)
    assert torch.equal(out[1]["w"], torch.ones(4))


def test_a_stalled_transfer_ends_at_its_deadline():
    sender = Sender(CPU)
    manifest = sender.stage({"w": torch.ones(4)}.items(), version=1)
    spec = sender.member.host(2, "gloo", 1.5)
    out, errors = {}, {}
    threads = _receive(manifest, spec, (1,), out, errors)
    sender.member._join(spec, 0, time.monotonic() + 30)  # joins, never sends
    threads[0].join(10)
    assert isinstance(errors[1], ChannelAborted) and "no transfer within 2 s while broadcasting" in str(errors[1])


def test_a_sent_version_stays_available_for_the_object_store_and_older_ones_go():
    sender = Sender(CPU)
    sender.stage({"w": torch.ones(4)}.items(), version=1)
    manifest = sender.stage({"w": torch.full((4,), 2.0)}.items(), version=2)
    spec = sender.member.host(2, "gloo", 30)
    out, errors = {}, {}
    threads = _receive(manifest, spec, (1,), out, errors)
    sender.send(spec, 2)
    threads[0].join(30)
    assert set(sender._staged) == {2}
    from gyre.cluster.weights import unpack_weights

    assert torch.equal(unpack_weights(sender.bundle(2))["w"], torch.full((4,), 2.0))


def test_checksums_by_hand():
    # A host bucket: adler32, as zlib computes it ("abc": 0x024d0127).
    assert bucket_checksum(torch.tensor(list(b"abc"), dtype=torch.uint8)) == 0x024D0127
    # A device bucket's block sum, computed here on CPU. Two 32-bit words in one (partial) block: (1 + 2) * 1.
    assert block_checksum(torch.tensor([1, 2], dtype=torch.int32).view(torch.uint8)) == 3
    # 1025 words: a full block of ones (sum 1024, weight 1) and a partial block holding 5 (weight 2).
    words = torch.ones(1025, dtype=torch.int32)
    words[-1] = 5
    assert block_checksum(words.view(torch.uint8)) == 1024 * 1 + 5 * 2
    # Swapping two blocks changes it; a plain sum would not see it.
    blocks = torch.cat([torch.zeros(1024, dtype=torch.int32), torch.ones(1024, dtype=torch.int32)])
    swapped = torch.cat([blocks[1024:], blocks[:1024]])
    assert block_checksum(blocks.view(torch.uint8)) == 2048 and block_checksum(swapped.view(torch.uint8)) == 1024


def test_stage_buckets_places_tensors_aligned_and_views_them_back():
    state = _state()
    buckets, metas = stage_buckets(state.items(), CPU, bucket_bytes=40_000)
    # embed (38400 B) and the small ones fit 40 kB (each starts at a multiple of 8); head needs its own.
    assert [m.bucket for m in metas] == [0, 0, 0, 0, 1]
    assert [(m.offset, m.nbytes) for m in metas[1:4]] == [(38400, 12), (38416, 8), (38424, 3)]
    assert [b.numel() for b in buckets] == [38432, 76800]
    views = bucket_views(buckets, metas)
    assert all(torch.equal(views[k], v) for k, v in state.items())


def test_an_abort_frees_a_member_waiting_for_a_lost_one_to_build_the_group():
    sender = Sender(CPU)
    manifest = sender.stage({"w": torch.ones(4)}.items(), version=1)
    spec = sender.member.host(3, "gloo", 60)  # engine 2 never comes: gloo would wait 70 s to connect
    out, errors, members = {}, {}, {}
    threads = _receive(manifest, spec, (1,), out, errors, members)
    time.sleep(0.5)
    t0 = time.monotonic()
    members[1].abort(spec.generation)
    threads[0].join(10)
    assert "aborted while building its group" in str(errors[1]) and time.monotonic() - t0 < 2


def test_a_tensor_in_a_bucket_of_its_own_arrives_straight_in_the_engines_weight(monkeypatch):
    import gyre.cluster.channel as channel

    monkeypatch.setattr(channel, "SOLO_BYTES", 50_000)  # head.weight (76800 B) travels alone
    state = _state()
    sender = Sender(CPU)
    manifest = sender.stage(state.items(), version=1, bucket_bytes=40_000)
    spec = sender.member.host(2, "gloo", 30)
    head = torch.zeros(64, 300)
    wrong = torch.zeros(300, 64)  # embed.weight is bf16 [300, 64]: a float32 target is not received into
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault(1, ChannelMember(CPU).receive(
        ChannelWeights(manifest, spec), 1, {"head.weight": head, "embed.weight": wrong})))
    thread.start()
    sender.send(spec, 1)
    thread.join(30)
    assert out[1]["head.weight"].data_ptr() == head.data_ptr() and torch.equal(head, state["head.weight"])
    assert torch.equal(wrong, torch.zeros(300, 64)) and torch.equal(out[1]["embed.weight"], state["embed.weight"])

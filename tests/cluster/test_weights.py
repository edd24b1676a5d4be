import pytest
import torch

from gyre.cluster.weights import pack_weights, unpack_weights


def test_round_trip_any_dtype_and_several_buckets():
    state = {
        "a": torch.randn(3, 4),
        "b": torch.randn(10).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int64).view(2, 3),
        "d": torch.randn(5, 5).t(),  # non-contiguous
    }
    bundle = pack_weights(state, version=7, bucket_bytes=64)
    assert len(bundle.buckets) > 1 and bundle.version == 7
    out = unpack_weights(bundle)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def test_corrupt_bucket_is_detected():
    bundle = pack_weights({"w": torch.ones(16)}, version=1)
    bundle.buckets[0] = bundle.buckets[0].copy()
    bundle.buckets[0][3] ^= 0xFF
    with pytest.raises(RuntimeError, match="corrupt"):
        unpack_weights(bundle)

"""Loading models quietly: transformers' deprecation notices do not repeat in every process of every run."""

import warnings


def test_transformers_future_warnings_are_silenced_and_others_are_kept():
    from gyre.models.loading import quiet_transformers

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_transformers()
        for module in ("transformers.configuration_utils", "transformers", "mypackage.models"):
            warnings.warn_explicit("`rope_scaling` is deprecated", FutureWarning, "f.py", 1, module=module)
        warnings.warn_explicit("a real problem", UserWarning, "f.py", 1, module="transformers.modeling_utils")
    assert [(type(w.message), str(w.message)) for w in caught] == [
        (FutureWarning, "`rope_scaling` is deprecated"), (UserWarning, "a real problem")]  # only mypackage's kept


def test_a_model_for_a_device_is_read_straight_onto_it(monkeypatch):
    """On an accelerator the weights go straight to device memory (transformers' device_map), never
    through a host copy of the whole model; on CPU nothing is asked of the loader."""
    from gyre.models.loading import _built

    calls = []

    class Loader:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls.append(kwargs)
            return "model"

    assert _built(Loader, "m", "cuda:1", dtype="bf16") == "model"
    assert _built(Loader, "m", "cpu", dtype="bf16") == "model"
    assert calls == [{"device_map": "cuda:1", "dtype": "bf16"}, {"dtype": "bf16"}]

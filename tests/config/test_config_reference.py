"""The configuration reference read from the schema, and ``gyre config --describe KEY`` printing it."""

import pytest

from gyre.app.cli import main
from gyre.config.load import ConfigError
from gyre.config.reference import children, describe, field_docs, find, first_sentence, schema_for, type_text


def test_a_key_shows_its_path_type_default_choices_and_docstring():
    text = describe("rollout.async_mode")
    lines = text.splitlines()
    assert lines[:4] == ["rollout.async_mode", "  type: window | lockstep", "  default: window",
                         "  allowed: window, lockstep"]
    assert "How asynchrony (async_ratio > 0) decides" in text
    assert describe("rollout.async_ratio").splitlines()[1:3] == ["  type: float >= 0", "  default: 0.0"]
    assert describe("rollout.max_batch_size").splitlines()[1:3] == ["  type: int > 0 | None", "  default: null"]
    assert describe("rollout.devices").splitlines()[1:3] == ["  type: list[int]", "  default: [0]"]


def test_a_section_lists_its_keys_one_line_each():
    text = describe("rollout.sampling")
    keys = text.split("keys:\n")[1].splitlines()
    sampling = schema_for("rlvr").model_fields["rollout"].annotation.model_fields["sampling"].annotation
    assert [k.split()[0] for k in keys] == [f"rollout.sampling.{name}" for name in sampling.model_fields]
    assert keys[0].split() == ["rollout.sampling.temperature", "float", ">=", "0", "=", "1.0", "0", "means", "greedy",
                               "decoding."]
    assert keys[1].split()[:6] == ["rollout.sampling.top_p", "float", ">", "0,", "<=", "1"]
    top = describe(None).splitlines()[1:]
    assert [line.split()[0] for line in top] == list(schema_for("rlvr").model_fields)


def test_domain_names_and_the_reward_short_form_find_their_key():
    docs = field_docs(schema_for("rlvr"))
    short, named = find(docs, "reward.type"), find(docs, "reward.domains.code.type")
    assert short == named and short.path == "reward.domains.<name>.type"
    assert "code" in short.choices and short.default == "math"
    assert "(a single domain writes it reward.type)" in describe("reward.type")
    shaping = find(docs, "reward.shaping")
    assert [d.path for d in children(docs, shaping)] == [
        "reward.domains.<name>.shaping[].function", "reward.domains.<name>.shaping[].kwargs",
        "reward.domains.<name>.shaping[].weight"]


def test_sft_and_dpo_keys_use_their_own_schemas():
    assert "default: 0.1" in describe("dpo.beta")  # dpo.* picks gyre dpo's schema by itself
    # a section's own default wins over its class's: gyre dpo's run is SFTRunSection(name="gyre-dpo")
    assert "run.name        str = gyre-dpo" in describe("run", "dpo")
    assert "run.name        str = gyre-sft" in describe("run", "sft")
    with pytest.raises(ConfigError, match="unknown config key 'rollout'"):
        describe("rollout", "sft")


@pytest.mark.parametrize("key, hint", [
    ("policy.lr", "did you mean 'policy.optimizer.lr'?"),
    ("rollout.asyn_ratio", "did you mean 'rollout.async_ratio'?"),
    ("num_generations", "did you mean 'rollout.samples_per_prompt'? (TRL: num_generations)"),
    ("actor_rollout_ref.rollout.n", "did you mean 'rollout.samples_per_prompt'? (verl: actor_rollout_ref.rollout.n)"),
    ("reward.typ", "did you mean 'reward.type'?"),
])
def test_an_unknown_key_names_the_closest_valid_one(key, hint):
    with pytest.raises(ConfigError) as err:
        describe(key)
    assert f"unknown config key {key!r}; {hint}" in str(err.value)


def test_a_key_gyre_moved_shows_the_key_it_became():
    text = describe("algorithm.cispo_low")
    assert text.startswith("algorithm.cispo_low is now algorithm.loss.cispo.low\n\nalgorithm.loss.cispo.low\n"
                           "  type: float >= 0\n  default: 0.1\n")
    assert describe("algorithm.lam").splitlines()[2:5] == ["algorithm.advantage.gae.lam", "  type: float >= 0, <= 1",
                                                           "  default: 0.95"]


def test_gyre_config_describe_on_the_command_line(capsys):
    assert main(["config", "--describe", "algorithm.loss.clip_high"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algorithm.loss.clip_high\n  type: float >= 0\n  default: 0.2\n")
    assert main(["config", "--describe", "policy.lr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre: error: unknown config key 'policy.lr'; did you mean 'policy.optimizer.lr'?")
    assert main(["config", "--describe", "beta", "--pipeline", "dpo"]) == 2
    assert "did you mean 'dpo.beta'? (TRL: beta)" in capsys.readouterr().err


def test_readable_types_and_first_sentences():
    from typing import Annotated, Literal

    from pydantic import Field

    assert type_text(Annotated[int, Field(gt=0)] | None) == "int > 0 | None"
    assert type_text(Literal["a", "b"]) == "a | b"
    assert type_text(dict[str, int]) == "dict[str, int]"
    assert first_sentence("The split, e.g. train. More.") == "The split, e.g. train."

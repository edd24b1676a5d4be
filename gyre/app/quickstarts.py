"""The quickstarts' configs: each recipe with its tiny model and task created under the run's directory."""

from __future__ import annotations

from pathlib import Path


def quickstart_config(out: Path, overrides: list[str]):
    """The quickstart recipe with its tiny model and arithmetic task created under ``out`` if missing."""
    from gyre.config.load import load_config
    from gyre.models.presets import init_model
    from gyre.recipes import recipe_path
    from gyre.tasks.arithmetic import write_arithmetic_task

    model, data = out / "model", out / "data"
    if not (model / "config.json").exists():
        init_model("tiny", model)
        print(f"created a tiny model in {model}")
    if not (data / "train.jsonl").exists():
        write_arithmetic_task(data)
        print(f"wrote the arithmetic task to {data}")
    base = [f"run.output_dir={out}", f"model.path={model}", f"data.train_files=[{data / 'train.jsonl'}]",
            f"data.val_files=[{data / 'val.jsonl'}]", f"sft_warmup.train_files=[{data / 'sft.jsonl'}]"]
    return load_config(recipe_path("quickstart"), [*base, *overrides])


def agentic_quickstart_config(out: Path, overrides: list[str]):
    """The agentic quickstart recipe with its tiny model and SFT transcripts created under ``out``."""
    from gyre.config.load import load_config
    from gyre.models.presets import init_model
    from gyre.recipes import recipe_path
    from gyre.tasks.guess import GuessSpec, write_guess_task

    model, data = out / "model", out / "data"
    base = [f"run.output_dir={out}", f"model.path={model}", f"sft_warmup.train_files=[{data / 'sft.jsonl'}]"]
    cfg = load_config(recipe_path("agentic_quickstart"), [*base, *overrides])
    if not (model / "config.json").exists():
        init_model("tiny", model)
        print(f"created a tiny model in {model}")
    if not (data / "sft.jsonl").exists():
        game = {k: v for k, v in cfg.env.kwargs.items() if k in ("low", "high", "max_turns")}
        write_guess_task(data, GuessSpec(**game))  # the game the run will play
        print(f"wrote the warm-up transcripts to {data}")
    return cfg


def tool_use_quickstart_config(out: Path, overrides: list[str]):
    """The tool-use quickstart recipe, its tiny model (with a chat template) and warm-up created under ``out``."""
    from gyre.config.load import ConfigError, load_config
    from gyre.models.loading import load_tokenizer
    from gyre.models.presets import init_model
    from gyre.recipes import recipe_path
    from gyre.tasks.tool_use import TEMPLATE, write_tool_task

    try:
        import openai  # noqa: F401 - the agent program's client
    except ImportError:
        raise ConfigError("the tool-use quickstart's agent uses the openai client: pip install openai") from None
    model, data = out / "model", out / "data"
    base = [f"run.output_dir={out}", f"model.path={model}", f"sft_warmup.train_files=[{data / 'sft.jsonl'}]"]
    cfg = load_config(recipe_path("tool_use_quickstart"), [*base, *overrides])
    if not (model / "config.json").exists():
        init_model("tiny", model)
        tokenizer = load_tokenizer(model)
        tokenizer.chat_template = TEMPLATE
        tokenizer.save_pretrained(model)
        print(f"created a tiny model with a chat template in {model}")
    if not (data / "sft.jsonl").exists():
        write_tool_task(data)
        print(f"wrote the warm-up conversations to {data}")
    return cfg


QUICKSTARTS = {"arithmetic": (quickstart_config, "runs/quickstart"),
               "guess_number": (agentic_quickstart_config, "runs/agentic-quickstart"),
               "tool_use": (tool_use_quickstart_config, "runs/tool-use-quickstart")}
"""``gyre quickstart --task``: the config builder and default directory of each."""

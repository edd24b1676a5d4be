"""The README's "Coming from TRL or verl" section, run as written: its data script, reward file, configs and
commands are read out of README.md (so they cannot drift apart) and run in an empty directory. The TRL,
verl, MBPP and TRL-SFT layouts each pass ``gyre check``: every row read, the reward called on real rows."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

from gyre.app.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Coming from TRL or verl"


def section() -> str:
    text = README.read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    return text.split(HEADING, 1)[1].split("\n## ", 1)[0]


def test_the_newcomer_section_runs_as_written(tmp_path, monkeypatch, capsys):
    from gyre.rewards.sandbox.probe import capabilities

    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section(), flags=re.M | re.S)
    files = {}
    for lang, body in blocks:
        first = body.splitlines()[0]
        if lang in ("python", "yaml") and first.startswith("# "):
            files[first[2:].strip()] = body
            (tmp_path / first[2:].strip()).write_text(body)
    assert set(files) == {"make_data.py", "trl_rewards.py", "trl_math.yaml", "verl_math.yaml", "mbpp.yaml",
                          "trl_sft.yaml"}
    commands = [shlex.split(line, comments=True) for lang, body in blocks if lang == "bash"
                for line in body.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["gyre", "init-model"], ["python", "make_data.py"]] + \
        [["gyre", "check"]] * 4
    sandbox = capabilities().contained
    for argv in commands:
        if argv[0] == "python":
            runpy.run_path(str(tmp_path / argv[1]), run_name="__main__")
            continue
        code = main(argv[1:])
        out, err = capsys.readouterr()
        if argv[-1] == "mbpp.yaml" and not sandbox:  # no kernel sandbox here: the code reward refuses to run
            assert code == 2 and "sandbox" in err
            continue
        assert code == 0, f"{shlex.join(argv)}:\n{out[-1500:]}\n{err[-1500:]}"
        if argv[1] == "check" and argv[2] != "trl_sft.yaml":
            assert "data: 4 training prompts" in out or "data: 2 training prompts" in out
    assert "data: 4 examples" in out  # the SFT check: 4 conversations, their completions trained

"""The seeded runs of ``golden.py`` reproduce their committed metric streams (see that module's docstring
for when and how to rewrite them)."""

import json

import pytest

from tests.pipelines.golden import CASES, GOLDEN_DIR, differences, run_case


# The PPO case (every role in its own process, about 25 s) runs with `make test-all`; the default suite
# keeps the quickstart's stream.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "quickstart" else n
                                  for n in sorted(CASES)])
def test_metric_stream_matches_golden(name, tmp_path):
    golden = [json.loads(line) for line in (GOLDEN_DIR / f"{name}.jsonl").read_text().splitlines()]
    problems = differences(golden, run_case(name, tmp_path / name))
    assert not problems, f"{len(problems)} differences from the golden stream, first: " + "; ".join(problems[:8])

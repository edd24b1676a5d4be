"""The simulator's golden scheduler streams (``tests/sim/golden.py``: when and how to rewrite them)."""

import json

import pytest

from tests.sim.golden import CASES, GOLDEN_DIR, differences, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_scheduler_stream_matches_golden(name):
    golden = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    problems = differences(golden, run_case(name))
    assert not problems, f"{len(problems)} differences from the golden stream, first: " + "; ".join(problems[:8])

"""The config path never imports torch: ``import gyre.config``, loading and planning a run config, what
``gyre check`` prints of it, the specs the driver builds from it, the reference, and ``gyre config
--describe`` on the command line. Each runs in a fresh interpreter, so what other tests imported does not count."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "ray")

CONFIG_STAGE = """
import json, sys
import gyre.config, gyre.config.load, gyre.config.reference, gyre.config.report
import gyre.config.sft_schema, gyre.config.dpo_schema
from gyre.config import load_config, make_plan
from gyre.config.reference import describe
from gyre.config.report import format_plan, resolved_yaml

for path, kind, devices in (("examples/ppo_critic.yaml", "cuda", 4), ("gyre/recipes/quickstart.yaml", "cpu", 2),
                            ("examples/agentic_guess_number.yaml", "cpu", 4)):
    cfg = load_config(path, ["algorithm.clip_high=0.3"])  # a key of an earlier gyre too: the alias table's move
    format_plan(cfg, make_plan(cfg, kind, devices)), resolved_yaml(cfg)
    cfg.algorithm.loss_spec(1.0, "recomputed"), cfg.algorithm.advantage.spec(), cfg.algorithm.kl.spec()
describe("algorithm.loss.cispo.low"), describe(None), describe("dpo.beta", "dpo")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""

DESCRIBE = """
import json, sys
from gyre.app.cli import main
assert main(["config", "--describe", "algorithm.loss.clip_high"]) == 0
assert main(["config", "--describe", "algorithm.nonsense"]) == 2
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


def _imported(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code % (HEAVY,)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_config_stage_imports_no_torch():
    assert _imported(CONFIG_STAGE) == []


def test_gyre_config_describe_imports_no_torch():
    assert _imported(DESCRIBE) == []

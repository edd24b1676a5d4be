"""`gyre train --address` joins a Ray cluster that was started outside gyre (as on a real cluster)."""

import json
import subprocess
import sys

import pytest
import yaml


@pytest.fixture()
def external_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    yield cluster
    cluster.shutdown()


@pytest.mark.slow  # make test-all (CI time); the private-Ray test keeps a second cluster in the default run
def test_train_joins_an_existing_cluster(external_cluster, tmp_path, tiny_model_dir, arithmetic_data):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"output_dir": str(tmp_path / "run"), "steps": 2},
        "model": {"path": str(tiny_model_dir)},
        "data": {"train_files": [str(arithmetic_data["train"])]},
        "rollout": {"devices": [1], "prompts_per_step": 2, "samples_per_prompt": 2,
                    "sampling": {"max_new_tokens": 3}},
        "policy": {"devices": [0], "micro_batch_size": 4},
        "logging": {"progress": False, "trackers": [], "plot": False},
    }))
    cmd = [sys.executable, "-m", "gyre.app.cli", "train", str(config), "--address", external_cluster.address]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 3 CPUs in the cluster: 2 device slots (one is kept for the reward worker), disaggregated placement.
    assert "placement: 2 CPU slot(s) available, layout disaggregated" in proc.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]

"""Placement on a real two-raylet Ray cluster (two nodes on this machine, 2 CPUs and 2 logical GPUs each:
Ray schedules GPUs it is told of, so the GPU path runs without one): each node holds consecutive logical
devices, so a role's devices share a node, in GPU order, and a tensor-parallel engine's GPUs are one
bundle; and a `gyre train` run whose policy and rollout land on different nodes completes. The driver
side runs in subprocesses: this session's own Ray (tests/conftest.py) may be running already, and a
process joins one cluster at a time."""

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

# Joins the cluster at argv[1], places each plan (config overrides, device kind) and prints, per plan, the
# node and GPUs of each logical device and the run's node map.
_PLACE = textwrap.dedent("""
    import json, sys
    import ray
    from ray.util.placement_group import remove_placement_group
    from gyre.cluster.placement import create_placement
    from gyre.config import load_config, make_plan

    ray.init(address=sys.argv[1], log_to_driver=False)
    out = []
    for overrides, kind in json.loads(sys.argv[2]):
        cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", *overrides])
        placement = create_placement(make_plan(cfg, kind, 4), timeout_s=30)
        site = {d: placement.sites[b] for d, b in placement.bundle_of.items()}
        out.append({"node": {d: s.node_id for d, s in site.items()}, "gpus": {d: s.gpu_ids for d, s in site.items()},
                    "bundles": placement.bundles, "describe": placement.describe()})
        remove_placement_group(placement.group)
    print(json.dumps(out))
""")

# The nodes each worker class's actors ran on (the GCS keeps finished actors' records).
_ACTOR_NODES = textwrap.dedent("""
    import json, sys
    import ray
    from ray._private.state import actors

    ray.init(address=sys.argv[1], log_to_driver=False)
    nodes = {}
    for actor in actors().values():
        nodes.setdefault(actor["ActorClassName"].rsplit(".", 1)[-1], set()).add(actor["Address"]["NodeID"])
    print(json.dumps({k: sorted(v) for k, v in nodes.items()}))
""")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _python(script: str, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_each_node_holds_consecutive_devices(two_nodes):
    plans = [(["policy.devices=[0,1]", "rollout.devices=[2,3]"], "cpu"),
             (["policy.devices=[0,1]", "rollout.devices=[2]"], "cpu"),
             (["policy.devices=[0,1]", "rollout.devices=[2,3]"], "cuda"),
             (["policy.devices=[0,1]", "rollout.devices=[2,3]", "rollout.backend=vllm",
               "rollout.tensor_parallel_size=2"], "cuda")]
    even, uneven, gpus, tp = json.loads(_python(_PLACE, two_nodes.address, json.dumps(plans)))
    node = {int(d): n for d, n in even["node"].items()}
    # Four bundles fill both nodes: the policy's devices on one, the rollout's on the other.
    assert node[0] == node[1] and node[2] == node[3] and node[0] != node[2], even
    assert even["describe"].startswith("placement on 2 node(s):")
    # Three bundles, two on one node: the policy's pair takes the fuller node whole.
    node = {int(d): n for d, n in uneven["node"].items()}
    assert node[0] == node[1] != node[2], uneven
    # GPUs: each node's devices in GPU order (a task in each bundle asked Ray which GPU backs it).
    node = {int(d): n for d, n in gpus["node"].items()}
    assert node[0] == node[1] != node[2] == node[3], gpus
    assert [gpus["gpus"][str(d)] for d in range(4)] == [[0], [1], [0], [1]], gpus
    assert "on GPUs [0, 1]" in gpus["describe"]
    # A tensor-parallel engine: its two GPUs are one bundle, a node of its own.
    assert tp["bundles"] == [{"GPU": 1, "CPU": 1}] * 2 + [{"GPU": 2, "CPU": 1}], tp
    node = {int(d): n for d, n in tp["node"].items()}
    assert node[0] == node[1] != node[2] == node[3] and tp["gpus"]["2"] == tp["gpus"]["3"] == [0, 1], tp


@pytest.mark.slow  # about 40 s on 2 cores: a real run of two trainer ranks and an engine on two raylets
def test_a_run_spans_two_nodes(two_nodes, tmp_path, tiny_model_dir, arithmetic_data):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"output_dir": str(tmp_path / "run"), "steps": 2, "max_restarts": 0},
        "model": {"path": str(tiny_model_dir)},
        "data": {"train_files": [str(arithmetic_data["train"])]},
        "rollout": {"devices": [2], "prompts_per_step": 2, "samples_per_prompt": 2,
                    "sampling": {"max_new_tokens": 3}},
        "policy": {"devices": [0, 1], "micro_batch_size": 2},
        "logging": {"progress": False, "trackers": [], "plot": False},
        "cluster": {"device": "cpu"},  # the nodes' GPUs are logical only
    }))
    cmd = [sys.executable, "-m", "gyre.app.cli", "train", str(config), "--address", two_nodes.address]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 4 CPUs: 3 device slots and the reward worker's CPU; the policy's two ranks fill one node, the engine
    # runs on the other.
    assert "placement: 3 CPU slot(s) available, layout disaggregated" in proc.stdout
    assert "placement on 2 node(s):" in proc.stdout, proc.stdout[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    ran = json.loads(_python(_ACTOR_NODES, two_nodes.address))
    assert len(ran["PolicyWorker"]) == 1 and len(ran["RolloutWorker"]) == 1, ran
    assert ran["PolicyWorker"] != ran["RolloutWorker"], ran

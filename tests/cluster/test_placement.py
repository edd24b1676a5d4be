"""Placement without Ray: which bundle each logical device takes (node, then GPU order), the bundles a plan
asks for (a tensor-parallel engine's GPUs in one), and each worker's share of its bundle. The same on a
real two-raylet cluster: tests/cluster/test_two_nodes.py."""

import pytest

from gyre.cluster.placement import BundleSite, Placement, arrange, units
from gyre.config import load_config, make_plan


def test_interleaved_bundles_are_handed_out_node_by_node():
    # Ray numbered the bundles as asked, but they landed alternately on two nodes of two each.
    a, b = BundleSite("aaaa", "10.0.0.1"), BundleSite("bbbb", "10.0.0.2")
    order = arrange([1, 1, 1, 1], [b, a, b, a])
    assert order == [1, 3, 0, 2]  # devices 0-1 on node a (the lower address), 2-3 on node b


def test_within_a_node_devices_follow_the_gpu_order():
    sites = [BundleSite("n", "10.0.0.1", (g,)) for g in (3, 1, 2, 0)]
    assert [sites[i].gpu_ids for i in arrange([1] * 4, sites)] == [(0,), (1,), (2,), (3,)]
    ids = [BundleSite("n", "", (str(g),)) for g in (10, 9)]  # numeric ids compare as numbers, not text
    assert arrange([1, 1], ids) == [1, 0]


def test_the_node_holding_more_devices_comes_first():
    # Three bundles on two nodes: the leading role (devices 0-1) fills the fuller node whole.
    a, b = BundleSite("aaaa", "10.0.0.1"), BundleSite("bbbb", "10.0.0.2")
    assert arrange([1, 1, 1], [a, b, b]) == [1, 2, 0]


def test_tensor_parallel_bundles_go_to_units_of_their_size():
    sites = [BundleSite("n", "h", (5,)), BundleSite("n", "h", (4,)), BundleSite("n", "h", (2, 3)),
             BundleSite("n", "h", (0, 1))]
    assert arrange([1, 1, 2, 2], sites) == [1, 0, 3, 2]


def tp_plan(*overrides):
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "rollout.backend=vllm",
                             "policy.devices=[0,1]", "rollout.devices=[2,3,4,5]", "rollout.tensor_parallel_size=2",
                             *overrides])
    return make_plan(cfg, "cuda", 6)


def test_a_plan_asks_one_bundle_per_worker_device_group():
    assert units(tp_plan()) == [(0,), (1,), (2, 3), (4, 5)]
    colocated = make_plan(load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "policy.devices=[0,1]",
                                             "rollout.devices=[1,2]"]), "cuda", 3)
    assert units(colocated) == [(0,), (1,), (2,)]


def test_each_worker_asks_its_share_of_every_resource_of_its_bundle():
    pytest.importorskip("ray")
    plan = tp_plan()
    bundles = [{"GPU": 1, "CPU": 1}, {"GPU": 1, "CPU": 1}, {"GPU": 2, "CPU": 1}, {"GPU": 2, "CPU": 1}]
    placement = Placement(plan, object(), {0: 0, 1: 1, 2: 2, 3: 2, 4: 3, 5: 3}, bundles, [])
    engine = placement.actor_options("rollout", placement.worker_devices("rollout")[1][0])
    assert (engine["num_gpus"], engine["num_cpus"]) == (2, 1)
    assert engine["scheduling_strategy"].placement_group_bundle_index == 3
    colocated = make_plan(load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "policy.devices=[0]",
                                             "rollout.devices=[0]"]), "cuda", 1)
    shared = Placement(colocated, object(), {0: 0}, [{"GPU": 1, "CPU": 1}], [])
    assert shared.actor_options("rollout", 0)["num_gpus"] == 0.5


def test_the_node_map_names_each_nodes_devices_and_gpus():
    sites = [BundleSite("aaaaaaaa1", "10.0.0.1", (0,)), BundleSite("bbbbbbbb2", "10.0.0.2", (0, 1))]
    placement = Placement(tp_plan(), object(), {0: 0, 2: 1, 3: 1}, [], sites)
    assert placement.describe() == ("placement on 2 node(s):\n  node 10.0.0.1 (aaaaaaaa): devices [0] on GPUs [0]\n"
                                    "  node 10.0.0.2 (bbbbbbbb): devices [2, 3] on GPUs [0, 1]")
    assert placement.nodes == 2

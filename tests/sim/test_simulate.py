"""Simulated runs: the real scheduler on a simulated cluster, deterministic, within the staleness window."""

import importlib
import json
from pathlib import Path

import pytest

import gyre.pipelines.rlvr
import gyre.sim
import gyre.sim.run
from gyre.app.cli import main
from gyre.config import load_config
from gyre.rollout.buffer import GroupBuffer
from gyre.rollout.machine import RolloutMachine
from gyre.rollout.requests import RequestBook
from gyre.rollout.scheduler import RolloutScheduler
from gyre.sim.run import SimRun, simulate
from gyre.sim.scenario import scenario
from gyre.sim.sweep import settings, split_values

CONFIG = "examples/math_boxed.yaml"
SMALL = ["rollout.prompts_per_step=32", "rollout.samples_per_prompt=8", "rollout.sampling.max_new_tokens=4096",
         "simulate.steps=5", "simulate.warmup_steps=1", "policy.strategy=fsdp2"]
"""A small sweep of the 7B default: FSDP2, so the policy's state fits an H100 (the sweep refuses what does not)."""


def spec(devices: int, *overrides: str):
    return scenario(load_config(CONFIG, [*SMALL, *overrides]), devices)


def test_the_simulator_drives_the_machine_and_scheduler_training_drives():
    run = SimRun(spec(8))
    assert type(run.machine) is RolloutMachine and type(run.scheduler) is RolloutScheduler
    assert run.machine.scheduler is run.scheduler and run.machine.driver is run.cluster
    assert gyre.sim.run.RolloutMachine is gyre.pipelines.rlvr.RolloutMachine  # the class the pipeline builds
    # no scheduling logic of its own: no class in gyre.sim is a scheduler, a buffer or a request book
    modules = [importlib.import_module(f"gyre.sim.{m.stem}") for m in Path(gyre.sim.__file__).parent.glob("*.py")]
    classes = [c for m in modules for c in vars(m).values() if isinstance(c, type) and c.__module__ == m.__name__]
    assert classes and not [c for c in classes
                            if issubclass(c, (RolloutMachine, RolloutScheduler, GroupBuffer, RequestBook))]


@pytest.mark.parametrize("alpha", [0.5, 1, 2])
def test_simulated_lockstep_trains_every_sample_on_the_version_its_plan_names(alpha):
    """The machine's publication hold: an engine finishes its version's groups before it loads the next,
    so no trained sample mixes versions (with its own copy of the driver, the simulator trained 197 of
    1,536 samples on mixed versions at alpha 1 here, 207 at alpha 2)."""
    run = SimRun(spec(16, f"rollout.async_ratio={alpha}", "rollout.async_mode=lockstep", "simulate.steps=6"))
    trained, take = [], run.scheduler.take
    run.scheduler.take = lambda step: trained.append((step, take(step))) or trained[-1][1]
    run.run()
    plan = run.scheduler.spec.plan
    assert len(trained) == 6
    for step, groups in trained:
        wanted = [v for v, count in plan.parts(step) for _ in range(count)]
        assert [g.admitted_version for g in groups] == wanted
        for g in groups:
            assert all({s.weight_version for s in t.segments} == {g.admitted_version} for t in g.trajectories)


def test_a_seed_gives_the_same_numbers_and_a_small_sweep_is_pinned():
    first = [simulate(spec(n, f"rollout.async_ratio={a}")) for n in (8, 32) for a in (0, 2)]
    again = [simulate(spec(n, f"rollout.async_ratio={a}")) for n in (8, 32) for a in (0, 2)]
    steps = [[round(s.end, 6) for s in r.steps] for r in first]
    assert steps == [[round(s.end, 6) for s in r.steps] for r in again]
    # Pinned: a change to the scheduler, the engine or the cost model that moves these is deliberate.
    summary = [(round(r.step_s, 2), round(r.samples_per_s, 2), round(r.mean("staleness/mean"), 3)) for r in first]
    assert summary == PINNED


PINNED = [(133.59, 1.92, 0.0), (40.8, 6.27, 1.703), (135.55, 1.89, 0.0), (35.53, 7.2, 1.656)]


@pytest.mark.parametrize("alpha", [0, 0.5, 1.5, 4])
@pytest.mark.parametrize("devices", [8, 64, 512])
def test_the_staleness_window_holds_at_every_scale(alpha, devices):
    result = simulate(spec(devices, f"rollout.async_ratio={alpha}", "simulate.steps=6", "rollout.prompts_per_step=64"))
    limit = -(-alpha // 1)
    for step in result.steps:
        assert step.stats["staleness/violations"] == 0
        assert step.stats["staleness/max_start"] <= limit
        assert step.samples == 64 * 8
    if alpha >= 1:  # the window is used: asynchrony runs ahead
        assert max(s.stats["staleness/max_start"] for s in result.steps) == limit


def test_asynchrony_and_queue_scheduling_beat_a_synchronous_step_on_a_long_tail():
    sync = simulate(spec(64))
    queue = simulate(spec(64, "rollout.schedule=queue"))
    async2 = simulate(spec(64, "rollout.async_ratio=2"))
    assert queue.mean("generate_s") < sync.mean("generate_s")
    assert async2.samples_per_s > 1.3 * sync.samples_per_s


def test_sweep_values_split_on_top_level_commas_only():
    assert split_values("0,1,[2,3],{a: 1, b: 2}") == ["0", "1", "[2,3]", "{a: 1, b: 2}"]
    assert settings(["a=1,2", "b=x,y"]) == [{"a": "1", "b": "x"}, {"a": "1", "b": "y"}, {"a": "2", "b": "x"},
                                           {"a": "2", "b": "y"}]
    with pytest.raises(ValueError, match="key=value1,value2"):
        settings(["rollout.async_ratio"])


def test_gyre_simulate_writes_a_table_and_a_plot_and_keeps_an_earlier_sweep(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["simulate", CONFIG, *SMALL, "--devices", "8,16", "--set", "rollout.async_ratio=0,2", "--set",
            "rollout.tail_batching={}", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "skipped: tail batching keeps synchronous semantics" in printed  # async + tail is no valid setting
    rows = json.loads((out / "sweep.json").read_text())
    assert [(r["devices"], r["set:rollout.async_ratio"]) for r in rows] == [(8, "0"), (16, "0"), (8, "2"), (16, "2")]
    assert all(r["violations"] == 0 for r in rows if "error" not in r)
    assert (out / "sweep.png").stat().st_size > 10_000 and (out / "sweep.csv").is_file()
    assert main(argv) == 2  # the earlier sweep is kept
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


def test_a_bad_simulate_key_names_the_valid_ones(capsys):
    assert main(["simulate", CONFIG, "simulate.device=tpu9"]) == 2
    assert "h100" in capsys.readouterr().err


def test_zero_devices_is_an_error_not_an_empty_sweep(tmp_path, capsys):
    for devices in ("0", "8,-1"):
        assert main(["simulate", CONFIG, "--devices", devices, "--out", str(tmp_path / devices)]) == 2
        assert "every device count must be at least 1" in capsys.readouterr().err
        assert not (tmp_path / devices).exists()


def test_calibrating_from_a_runs_metrics_fits_the_lengths_it_simulates(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    row = {"time/step": 1.0, "batch/samples": 256, "response_length/mean": 300.0, "response_length/max": 2500.0,
           "response_length/truncated_frac": 0.0}
    metrics.write_text("".join(json.dumps({"step": k, **row}) + "\n" for k in range(1, 6)))
    assert main(["simulate", CONFIG, *SMALL, "--calibrate", str(metrics), "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "responses mean 3" in out  # the fitted mean before the cap (about 300), not the config's 1024
    assert main(["simulate", CONFIG, "--calibrate", str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize("alpha, mode, slots", [(0, "window", None), (1, "lockstep", None), (1, "window", 16)])
def test_only_window_asynchrony_dispatches_as_capacity_frees_in_training_and_simulation(alpha, mode, slots):
    from gyre.rollout.schedule import sampling_params, schedule_spec

    cfg = load_config(CONFIG, [*SMALL, "rollout.schedule=queue", "rollout.max_batch_size=16",
                               f"rollout.async_mode={mode}", f"rollout.async_ratio={alpha}"])
    # synchronous and lockstep runs keep requests on their engines from admission (a seed reproduces them)
    assert schedule_spec(cfg, sampling_params(cfg)).engine_slots == slots
    assert scenario(cfg, 8).schedule.engine_slots == slots  # the simulator runs what training would


def test_calibrating_from_a_run_directory_replays_its_recorded_groups(tmp_path):
    row = {"time/step": 1.0, "batch/samples": 4, "response_length/mean": 30.0, "response_length/max": 64.0,
           "response_length/truncated_frac": 0.25}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, **row}) + "\n")
    (tmp_path / "generations").mkdir()
    samples = [{"group": g, "sample": i, "response_tokens": n} for g, ns in (("a", (2, 3)), ("b", (64, 51))) for i, n
               in enumerate(ns)]
    (tmp_path / "generations" / "step_1.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    cfg = load_config(CONFIG, [*SMALL, "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=64"])
    spec_ = scenario(cfg, 8, calibrate=tmp_path)
    assert spec_.recorded == (((None, (2, 3)), (None, (64, 51))),)
    run = SimRun(spec_)
    prompts = [run.workload.prompt(i) for i in range(20)]
    assert {run.workload.response_tokens(p, s) for p in prompts for s in range(2)} == {2, 3, 64, 51}
    assert run.run().steps[-1].samples == 32 * 2


@pytest.mark.parametrize("case", ["window_1", "window_2_restart", "redundancy", "dynamic_sampling", "tail_rounds",
                                  "elastic_spot", "agentic_window"])
def test_every_generated_token_is_trained_held_or_counted_as_waste_at_scale(case):
    """The token counters on the simulator's engines (continued parts of samples whose engine left, turns of
    episodes, restarts): generated = trained + wasted + still held, summed over a run."""
    from gyre.config.load import load_config
    from gyre.sim.run import SimRun
    from gyre.sim.scenario import scenario
    from tests.sim.golden import CASES

    path, overrides = CASES[case]
    run = SimRun(scenario(load_config(path, overrides)))
    result = run.run()
    sched = run.scheduler
    total = {k: sum(s.stats.get(k, 0) for s in result.steps) + sched.stats.get(k, 0)
             for k in ("rollout/tokens_generated", "rollout/tokens_trained", "rollout/tokens_wasted")}
    assert total["rollout/tokens_generated"] == total["rollout/tokens_trained"] + total["rollout/tokens_wasted"] + \
        sched.tokens_held, total
    if not case.startswith("agentic"):  # a step's response_tokens count an episode's observations too
        assert sum(s.response_tokens for s in result.steps) == total["rollout/tokens_trained"]


def test_the_simulator_charges_the_engine_and_weight_transport_the_run_would_use():
    from gyre.config.load import ConfigError
    from gyre.sim.scenario import describe

    colocated = spec(8)  # the example's rollout and policy share device 0: NCCL cannot join, auto takes the store
    assert (colocated.cost.engine.name, colocated.cost.transport) == ("hf", "object_store")
    split = spec(8, "rollout.async_ratio=1")  # simulated disaggregated: rank 0's device is the policy's alone
    assert (split.cost.transport, split.cost.same_node) == ("channel", True)
    assert spec(64, "rollout.async_ratio=1").cost.same_node is False  # 64 devices span 8 nodes
    assert spec(8, "rollout.async_ratio=1", "rollout.weight_transport=object_store").cost.transport == "object_store"
    hybrid = spec(8, "rollout.mode=hybrid", "policy.strategy=ddp")
    assert (hybrid.cost.engine.name, hybrid.cost.transport) == ("hf", "none")
    assert spec(8, "rollout.mode=hybrid", "policy.strategy=fsdp2").cost.transport == "gather"
    assert spec(8, "rollout.backend=vllm", "rollout.async_ratio=1").cost.engine.name == "vllm"
    with pytest.raises(ConfigError, match="NCCL cannot join"):  # as gyre check refuses it
        spec(8, "rollout.weight_transport=channel")
    with pytest.raises(ConfigError, match="hybrid"):
        spec(8, "rollout.mode=hybrid", "rollout.backend=vllm")
    text = describe(split)
    assert "engine     hf (eager, 22.4 ms of kernel launches a step, KV read at the widest row's length" in text
    assert "weights    channel (NCCL broadcast within a node): sync 0.21 s, engines paused 0.19 s" in text


def test_the_sweep_refuses_a_setting_that_does_not_fit_and_prints_the_memory_of_one_that_does(tmp_path):
    """A 32B policy on 8 L40S (48 GB) cannot hold its optimizer state; 7B sharded over 16 H100 can."""
    from gyre.sim.sweep import format_row, run_sweep

    config = Path(__file__).parents[2] / "examples" / "math_boxed.yaml"
    rows = run_sweep(config, ["policy.strategy=fsdp2", "simulate.steps=3", "simulate.warmup_steps=1"], [8],
                     ["simulate.model=32b", "simulate.device=l40s"], echo=lambda s: None)
    (big,) = rows
    assert big.result is None and big.memory is not None and not big.memory.fits
    assert big.error.startswith("does not fit l40s (48 GB a device, 90% usable)")
    assert "optimizer" in big.error and "policy" in big.error
    rows = run_sweep(config, ["policy.strategy=fsdp2", "simulate.steps=3", "simulate.warmup_steps=1"], [16],
                     ["simulate.model=7b"], echo=lambda s: None)
    (fits,) = rows
    assert fits.result is not None and fits.memory.fits and 0 < fits.memory.peak_gb < 0.9 * 80
    m = fits.memory
    assert f"{m.train_gb:.1f}/{m.rollout_gb:.1f}" in format_row(fits, rows)
    assert fits.record()["mem_gb"] == m.peak_gb and m.peak_gb == max(m.train_gb, m.rollout_gb)  # offloaded in turn


def test_the_memory_of_each_side_follows_the_plan_gyre_check_makes():
    """Rollout and training side by side (asynchrony splits the devices): a vLLM engine reserves 0.9 x 80 GB
    = 72 GB of each of its devices; the policy and the KL reference share the training devices and, as
    make_plan decides for roles that share GPUs, take turns (offload): the larger counts, not the sum."""
    from gyre.config.memory import GB
    from gyre.sim.memory import memory_fit

    spec_ = spec(16, "rollout.async_ratio=1", "rollout.backend=vllm", "algorithm=grpo")
    fit = memory_fit(load_config(CONFIG, [*SMALL, "rollout.async_ratio=1", "rollout.backend=vllm", "algorithm=grpo"]),
                     spec_.layout, spec_.cost.model, spec_.cost.device, spec_.cost.transport)
    assert fit.rollout_gb == pytest.approx(0.9 * 80)
    policy, reference = (float(fit.roles[r].split(" GB")[0]) for r in ("policy", "reference"))
    assert fit.train_gb == pytest.approx(max(policy, reference), abs=0.05)
    assert fit.peak_gb == pytest.approx(max(fit.train_gb, fit.rollout_gb), abs=0.05)
    assert fit.peak_gb * GB < (policy + reference) * GB  # not the sum the two roles would need at once

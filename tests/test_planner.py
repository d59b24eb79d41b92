"""The planner: DDP's buckets and ring all-reduce, overlap with backward, the loader and the
pipeline bubble as pure functions; a real profile of a run on this CPU into runs.json/runs.md;
the sweep allocation choosing experiment or data parallelism by how well runs scale."""

from __future__ import annotations

import json

import pytest
import torch

from voxjet.errors import VoxjetError
from voxjet.planner import plan as plan_module
from voxjet.planner.allocate import allocate, makespan
from voxjet.planner.model import (
    DDP_BUCKET_BYTES,
    Links,
    Profile,
    buckets,
    cpu_slowdown,
    predict_pipeline_step,
    predict_step,
    ring_allreduce_s,
)
from voxjet.planner.plan import Site, plan_runs

LINKS = Links(intra_bw=1e9, inter_bw=1e8, latency_s=1e-5)


def test_buckets_are_ddps_and_add_up_to_the_gradients():
    grads = 60 * 2**20
    b = buckets(grads)
    assert b[0] == 2**20 and b[1] == DDP_BUCKET_BYTES and sum(b) == grads and len(b) == 4
    assert buckets(1000) == [1000] and buckets(0) == []


def test_ring_allreduce_moves_twice_the_data_less_a_share():
    # 2(n-1) steps of bytes/n each: 4 processes, 1 GB at 1 GB/s → 1.5 s plus 6 latencies
    assert ring_allreduce_s(1e9, 4, 1e9, 1e-3) == pytest.approx(1.5 + 6e-3)
    assert ring_allreduce_s(1e9, 1, 1e9, 1e-3) == 0.0


def test_backward_hides_communication_until_the_link_is_the_bottleneck():
    small = Profile(0.01, 0.02, 0.005, grad_bytes=4e6, batch=128)
    alone = predict_step(small, 1, 1, LINKS)
    assert alone.step_s == pytest.approx(0.035) and alone.exposed_comm_s == 0
    two = predict_step(small, 2, 1, LINKS)
    # 4 MB: a 1 MiB bucket, then the rest; only what follows the end of backward is paid
    assert 0 < two.exposed_comm_s < two.comm_s
    assert two.items_per_s == pytest.approx(2 * 128 / two.step_s)
    across = predict_step(small, 2, 2, LINKS)  # the slower link between nodes
    assert across.exposed_comm_s > two.exposed_comm_s
    big = Profile(0.01, 0.02, 0.005, grad_bytes=4e9, batch=128)
    slow = predict_step(big, 4, 1, LINKS)
    assert slow.exposed_comm_s == pytest.approx(slow.comm_s - 0.02, rel=0.05)


def test_a_slow_loader_bounds_the_step():
    p = Profile(0.01, 0.02, 0.005, grad_bytes=1e6, batch=128, loader_batches_per_s=10)
    pred = predict_step(p, 1, 1, LINKS)
    assert pred.loader_bound and pred.step_s == pytest.approx(0.1)
    # on a CPU the loader shares the cores: its time adds to the step's
    cpu = predict_step(p, 1, 1, LINKS, loader_overlaps=False)
    assert cpu.step_s == pytest.approx(0.035 + 0.1) and not cpu.loader_bound


def test_pipeline_step_carries_the_bubble():
    p = Profile(0.4, 0.8, 0.0, grad_bytes=0, batch=2)
    # 2 stages, 4 micro-batches: each stage computes half, stretched by (M+K-1)/M = 5/4
    assert predict_pipeline_step(p, 2, 4) == pytest.approx(0.6 * 5 / 4)


def test_allocation_takes_one_gpu_a_run_when_runs_scale_poorly_and_more_when_well():
    def times(eff: float) -> dict[str, dict[int, float]]:
        # 8 runs of 8 h on one GPU; at n GPUs 8 h / (n · eff^log2 n)
        return {f"r{i}": {n: 8 * 3600 / (n * eff ** (n.bit_length() - 1)) for n in (1, 2, 4, 8)}
                for i in range(8)}  # fmt: skip

    poor = allocate(times(0.6), budget=8)
    assert poor["choice"] == 1 and {o["processes"] for o in poor["options"]} == {1, 2, 4, 8}
    one = next(o for o in poor["options"] if o["processes"] == 1)
    assert one["slots"] == 8 and one["makespan_s"] == pytest.approx(8 * 3600)
    # 4 runs, 8 GPUs: perfect scaling makes 2 GPUs a run as fast and no dearer
    few = {k: v for k, v in list(times(1.0).items())[:4]}
    assert allocate(few, budget=8)["choice"] == 2
    assert makespan([5, 4, 3, 3, 3], 2) == 10  # longest first: 5+3 and 4+3+3
    assert allocate({}, 8)["choice"] is None


def _runs(shards, **train):
    cfg = {"model": {"name": "pfn", "phi_sizes": [32, 32], "f_sizes": [32]},
           "train": {"steps": 100, "batch_size": 64, "lr": 1e-3, **train}}  # fmt: skip
    return [
        {"run": "pfn_a", "experiment": "pfn", "domain": "jets", "data": str(shards), "read": {},
         "config": cfg, "processes": 1, "threads": 1},
        {"run": "pfn_b", "experiment": "pfn", "domain": "jets", "data": str(shards), "read": {},
         "config": {**cfg, "train": {**cfg["train"], "lr": 3e-3}}, "processes": 2,
         "threads": 1},
    ]  # fmt: skip


def test_plan_runs_profiles_once_a_configuration_and_predicts_every_size(shards, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    calls = []
    real = plan_module.profile_task
    monkeypatch.setattr(plan_module, "profile_task",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    out = plan_runs(_runs(shards), Site(gpu_budget=4, cores_per_node=2), tmp_path / "plan")
    assert len(calls) == 1  # the two runs differ only in learning rate
    saved = json.loads((tmp_path / "plan" / "runs.json").read_text())
    assert saved == json.loads(json.dumps(out))
    a, b = saved["runs"]
    prof = a["profile"]
    assert prof["forward_s"] > 0 and prof["backward_s"] > 0 and prof["batch"] == 64
    assert prof["grad_bytes"] == 4 * sum(p.numel() for p in _pfn(shards).parameters())
    sizes = [r["processes_total"] for r in a["predictions"]]
    assert sizes == [1, 2, 4]
    assert [r["own"] for r in a["predictions"]] == [True, False, False]
    assert [r["own"] for r in b["predictions"]] == [False, True, False]
    for r in a["predictions"]:
        # 100 steps, a validation (each process its share; 4 processes share 2 cores, so
        # theirs takes longer) and a checkpoint at the last
        n = r["processes_total"]
        share = plan_module.validation_at(Profile(**prof), n)  # measured at 1, 2 and 4
        assert share == dict(prof["validation_shares"])[n]
        extra = share * cpu_slowdown(Profile(**prof), 1, n, 2) + prof["checkpoint_s"]
        assert r["time_to_steps_s"] == pytest.approx(100 * r["step_s"] + extra)
        assert r["loop_overhead_s"] == pytest.approx(extra) and extra > 0
        assert r["energy_kwh"] is None  # no site.device_power_w: not predicted
        # the whole job: its start (measured: this process's), the model and first batch,
        # the steps with their warm-up, validations, checkpoints and model.pt, part by part
        parts = r["job_parts_s"]
        assert list(parts) == ["startup", "data", "steps", "validation", "checkpoints",
                               "export"] and parts["startup"] > 0 and parts["data"] > 0  # fmt: skip
        assert r["job_s"] == pytest.approx(sum(parts.values()))
        assert r["job_s"] > r["time_to_steps_s"] and r["job_items_per_s"] < r["items_per_s"]
    # 4 processes on 2 cores share them: no faster than 2
    assert a["predictions"][2]["items_per_s"] <= a["predictions"][1]["items_per_s"] * 1.01
    assert saved["allocation"]["choice"] in (1, 2, 4)
    # pfn_b trains in 2 CPU processes: gloo's link was measured for it, not the site's
    (link,) = saved["measured_link"]
    assert link["backend"] == "gloo" and saved["site"]["intra_node_gbps"] == 100.0
    md = (tmp_path / "plan" / "runs.md").read_text()
    assert "## pfn_a (100 steps)" in md and "Sweep allocation for a budget of 4 GPUs" in md
    # DDP, FSDP and pipeline compared, with the optimiser's state measured (AdamW: 2 × P)
    assert prof["optimizer_bytes"] == pytest.approx(2 * prof["grad_bytes"], rel=0.01)
    par = b["parallelism"]
    assert [o["scheme"] for o in par["options"]] == ["ddp", "fsdp"]  # a jets model: no pipeline
    assert par["scheme"] in ("ddp", "fsdp") and par["why"]
    assert "Data parallelism at 2 processes" in md and "| fsdp" in md
    assert "The training job at its own size (1 process(es))" in md


def _pfn(shards):
    from voxjet.jets.train import make_task

    task, _ = make_task(str(shards), {"model": {"name": "pfn", "phi_sizes": [32, 32],
                                                "f_sizes": [32]}, "train": {}})  # fmt: skip
    return task.build_model()


def test_a_run_whose_step_does_not_fit_is_named(shards, tmp_path, monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(plan_module, "profile_task", oom)
    with pytest.raises(VoxjetError, match=r"run pfn_a: one training step does not fit the "
                                          r"device .* lower train.batch_size"):  # fmt: skip
        plan_runs(_runs(shards), Site(), tmp_path / "plan")
    assert not (tmp_path / "plan" / "runs.json").exists()


def test_the_summary_sets_predictions_beside_measured_throughput(tmp_path):
    from voxjet.report.aggregate import aggregate
    from voxjet.report.runs import RunInfo

    d = tmp_path / "pfn"
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "metrics.json").write_text('{"accuracy": 0.8, "auc_macro": 0.9}')
    lines = [{"step": 10 * k, "loss": 1.0, "jets_per_s": 1000.0} for k in range(1, 6)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    plan = {"runs": [{"run": "pfn", "predictions": [
        {"processes_total": 1, "items_per_s": 1100.0, "own": True},
        {"processes_total": 2, "items_per_s": 2000.0, "own": False}]}]}  # fmt: skip
    (tmp_path / "runs.json").write_text(json.dumps(plan))
    run = RunInfo("ds", "jets", "pfn", "pfn", str(d / "eval" / "metrics.json"),
                  str(d / "metrics.jsonl"))  # fmt: skip
    aggregate([run], tmp_path / "summary", plan=str(tmp_path / "runs.json"))
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert "| pfn | 1 | steady | 1100 jets/s | 1000 jets/s | – | +10% |" in md
    assert "Mean absolute error 10% over 1 runs." in md
    assert (tmp_path / "summary" / "figures" / "pipeline-all-planner.png").stat().st_size > 1e4
    # the training job timed (its Snakemake benchmark): the whole job compared, both sides
    plan["runs"][0]["predictions"][0].update(job_s=100.0, job_items_per_s=500.0)
    (tmp_path / "runs.json").write_text(json.dumps(plan))
    bench = tmp_path / "benchmarks" / "train_jets" / "ds"
    bench.mkdir(parents=True)
    (bench / "pfn.tsv").write_text("s\th:m:s\tmax_rss\n125.0\t0:02:05\t100\n")
    aggregate([run], tmp_path / "summary", str(tmp_path / "benchmarks"),
              plan=str(tmp_path / "runs.json"))  # fmt: skip
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert "| pfn | 1 | job | 500 jets/s | 400 jets/s | 100 s / 125 s | +25% |" in md


def test_the_plan_runs_command_writes_the_plan(shards, tmp_path, capsys):
    from voxjet.cli import main

    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(_runs(shards)[:1]))
    assert main(["plan-runs", "--runs", f"@{runs}", "--site", '{"gpu_budget": 2}',
                 "--out", str(tmp_path / "plan")]) == 0  # fmt: skip
    saved = json.loads((tmp_path / "plan" / "runs.json").read_text())
    assert saved["site"]["gpu_budget"] == 2 and saved["allocation"]["choice"] in (1, 2)
    assert main(["plan-runs", "--runs", f"@{runs}", "--site", '{"gpus": 2}', "--out", "x"]) == 2
    assert "site: unknown keys ['gpus']" in capsys.readouterr().err


def test_a_profile_that_cannot_finish_in_the_jobs_time_names_the_run(shards, tmp_path):
    with pytest.raises(VoxjetError, match=r"run pfn_a: profiling cannot finish in the plan job's "
                       r"time: a step takes .*\(set-resources: plan_runs: runtime"):  # fmt: skip
        plan_runs(_runs(shards), Site(), tmp_path / "plan", time_limit_s=0.001)
    assert not (tmp_path / "plan").exists()


def test_validation_beyond_the_measured_shares_follows_a_plus_b_over_n():
    p = Profile(0.01, 0.02, 0.005, grad_bytes=1e6, batch=64, validation_s=1.0,
                validation_shares=[[1, 1.0], [2, 0.6], [4, 0.4]])  # fmt: skip
    assert plan_module.validation_at(p, 2) == 0.6
    assert plan_module.validation_at(p, 8) == pytest.approx(0.3)  # 0.2 + 0.8 / 8
    assert plan_module.validation_at(Profile(0, 0, 0, 0, 1, validation_s=2.0), 4) == 0.5


def test_the_loop_validates_and_checkpoints_where_the_prediction_counts():
    from voxjet.planner.plan import _at

    assert _at(200, 600) == 3  # 200, 400 and 600
    assert _at(30, 100) == 4  # 30, 60, 90 and the last
    assert _at(0, 100) == 0
    # between the windows after the first (steps 10..599): 200 and 400; 600 comes after them
    assert _at(200, 600, first=10) == 2
    assert _at(10, 600, first=10) == 59


def test_the_median_profile_shrugs_off_a_descheduled_step():
    """Steps that waited for a descheduled thread (the mean of 40 PFN steps was 12 times its
    median under load) move the median and the trimmed mean, the profile's statistic, by
    little."""
    from voxjet.planner.plan import _median, _precise, _settled, _trimmed_mean

    steady = [0.006 + 0.0002 * (k % 3) for k in range(40)]
    loaded = steady[:]
    loaded[5], loaded[17], loaded[30] = 0.56, 0.3, 0.2
    assert _median(loaded) == pytest.approx(_median(steady), rel=0.04)
    assert _trimmed_mean(loaded) == pytest.approx(sum(steady) / 40, rel=0.04)
    assert sum(loaded) / 40 > 3 * _median(loaded)
    assert _precise(steady, 0.02) and not _precise([0.01, 0.02, 0.05, 0.001], 0.02)
    assert _settled([0.5, 0.1, 0.011, 0.01, 0.0105, 0.0102, 0.0101])
    assert not _settled([0.5, 0.1, 0.05, 0.02, 0.01])


def test_the_measured_rate_is_items_over_seconds_after_the_first_window():
    from voxjet.report.scaling import steady_rate

    log = [
        {"step": 10, "loss": 1, "jets_per_s": 10.0, "window_s": 5.0},  # start-up
        {"step": 20, "loss": 1, "jets_per_s": 100.0, "window_s": 1.0},
        {"step": 25, "split": "val", "score": 0.5},
        {"step": 30, "loss": 1, "jets_per_s": 50.0, "window_s": 2.0},
    ]  # with a validation
    assert steady_rate(log) == (pytest.approx(200 / 3), "jets")
    old = [{k: v for k, v in r.items() if k != "window_s"} for r in log]
    assert steady_rate(old) == (pytest.approx(75.0), "jets")  # older logs: the windows' mean


def test_the_link_is_measured_between_two_processes_at_ddps_bucket_sizes():
    """What the planner does with NCCL when its job holds two GPUs, here with gloo (the same
    code): a positive bandwidth and latency from two message sizes."""
    from voxjet.planner.links import measure_link

    bw, lat = measure_link("gloo", sizes=(2**16, 2**22), repeats=5)
    assert bw > 1e6 and 0 <= lat < 0.1


def test_a_segmentation_run_whose_largest_case_would_not_fit_its_evaluation_job_is_refused():
    """plan_runs checks, before profiling, what predicting the dataset's largest case needs
    against the experiment's launch.mem_mb: refused naming the case, the need and the key;
    recorded for runs.md otherwise."""
    from types import SimpleNamespace

    fingerprint = {"case_ids": ["small", "wholebody"], "channels": ["CT"],
                   "shapes": [[100, 100, 50], [512, 512, 800]],
                   "spacings": [[1.0, 1.0, 1.0], [0.8, 0.8, 1.5]]}  # fmt: skip
    plan = SimpleNamespace(target_spacing=[0.8, 0.8, 1.5], outputs=15, patch_size=[128] * 3)
    task = SimpleNamespace(plan=plan, fingerprint=fingerprint)
    run = {"run": "ct_fold0", "experiment": "ct", "mem_mb": 4000}
    said = (
        r"run ct_fold0: predicting case 'wholebody' \(512×512×800 voxels after cropping\) "
        r"needs about \d+\.\d GiB, more than the 4000 MB the evaluation job is given "
        r"\(experiments\.ct\.launch\.mem_mb\); raise experiments\.ct\.launch\.mem_mb"
    )
    with pytest.raises(VoxjetError, match=said):
        plan_module.prediction_memory(run, task)
    got = plan_module.prediction_memory({**run, "mem_mb": 64000}, task)
    assert got["case"] == "wholebody" and got["shape"] == [512, 512, 800]
    assert 4000 * 2**20 < got["need_bytes"] < 64000 * 2**20
    # fingerprints from before case ids were kept name the case by its place
    older = {k: v for k, v in fingerprint.items() if k != "case_ids"}
    got = plan_module.prediction_memory({**run, "mem_mb": 64000}, SimpleNamespace(plan=plan,
                                        fingerprint=older))  # fmt: skip
    assert got["case"] == "case 2 of the fingerprint"
    profile = {"device": "cpu", "forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.01,
               "grad_bytes": 1e6, "batch": 2}  # fmt: skip
    md = plan_module.plan_markdown({"runs": [{"run": "ct_fold0", "steps": 10,
                                              "profile": profile, "predictions": [],
                                              "prediction_memory": got}]})  # fmt: skip
    assert "Predicting the dataset's largest case, case 2 of the fingerprint (512×512×800" in md


def _big_profile(**kw) -> Profile:
    """A step whose parameters and optimiser state dominate (a 1 GiB model, AdamW) on a GPU."""
    gib = 2**30
    base = dict(forward_s=0.1, backward_s=0.2, optimizer_s=0.02, grad_bytes=1.0 * gib, batch=8,
                peak_memory_bytes=5.0 * gib, device="cuda", optimizer_bytes=2.0 * gib,
                unit_bytes=0.05 * gib, units=21)  # fmt: skip
    return Profile(**{**base, **kw})


def test_a_run_that_fits_only_sharded_is_planned_fsdp_and_one_that_fits_nowhere_refused():
    from voxjet.errors import VoxjetError
    from voxjet.planner.model import Links
    from voxjet.planner.parallelism import choose, compare, memory_a_process

    gib, links = 2**30, Links(100e9, 12.5e9, 10e-6)
    p = _big_profile()
    # DDP: P + G + O + a bucketed copy of G + the rest (1 GiB): 6 GiB; FSDP over 4: 1 + 0.1 + 1
    assert memory_a_process(p, "ddp", 4) == pytest.approx(6 * gib)
    assert memory_a_process(p, "fsdp", 4) == pytest.approx(4 * gib / 4 + 0.1 * gib + 1 * gib)
    rows = compare(p, 4, 1, links, 4 * gib, pipelinable=False)
    chosen = choose(rows, 4 * gib, "big")
    assert chosen["scheme"] == "fsdp" and "DDP needs 6 GiB a process" in chosen["why"]
    roomy = choose(compare(p, 4, 1, links, 80 * gib, pipelinable=False), 80 * gib, "big")
    assert roomy["scheme"] == "ddp"  # FSDP's extra gathers buy nothing when DDP fits
    with pytest.raises(
        VoxjetError,
        match=r"run big: fits the device under no scheme at 4 "
        r"processes \(ddp 6 GiB, fsdp 2.1 GiB a process; the device has 1 GiB\)",
    ):
        choose(compare(p, 4, 1, links, 1 * gib, pipelinable=False), 1 * gib, "big")


def test_fsdp_sends_one_and_a_half_times_ddps_bytes_and_hides_them_behind_compute():
    from voxjet.planner.model import Links
    from voxjet.planner.parallelism import compare

    p = _big_profile()
    rows = {r.scheme: r for r in compare(p, 2, 1, Links(100e9, 12.5e9, 10e-6), None, True)}
    assert rows["fsdp"].sent_bytes == pytest.approx(1.5 * rows["ddp"].sent_bytes)
    assert set(rows) == {"ddp", "fsdp", "pipeline"}
    # a fast link: FSDP's step is compute, its optimiser's share halved, and the first gather
    assert rows["fsdp"].step_s == pytest.approx(0.1 + 0.2 + 0.01, rel=0.05)
    slow = {r.scheme: r for r in compare(p, 2, 1, Links(1e9, 1e9, 10e-6), None, False)}
    assert slow["fsdp"].step_s > slow["ddp"].step_s  # 1.5 × the bytes on a slow link

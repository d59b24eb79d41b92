"""The whole demo DAG through the real `snakemake` CLI, on a shrunken copy of the demo config,
with README's command lines as written: every rule runs, the summary has a row for each run of
both domains, a rerun does nothing, and the rerun commands rerun one stage alone."""

from __future__ import annotations

import csv
import json
import re
import subprocess

import pytest
import yaml
from conftest import job_counts, merge_config, run_snakemake, snakemake_env, write_config
from readme import README

TINY = {
    "datasets": {
        "toy_jets": {
            "source": {
                "synthetic": {"generator": "toy", "files_per_class": 1, "jets_per_file": 400}
            },
            "jets": {"max_particles": 32, "jets_per_shard": 500},
        },
        "toy_ct": {
            "source": {"synthetic": {"train_cases": 7, "test_cases": 1}},
            "volumes": {"patch_size": [32, 32, 16]},
        },
    },
    "experiments": {
        "pfn": {"train": {"steps": 120, "eval_every": 60, "lr": 0.002}, "launch": {"threads": 1}},
        "particlenet": {"train": {"steps": 150, "eval_every": 75}, "launch": {"threads": 1}},
        "part": {"train": {"steps": 150, "eval_every": 75}, "launch": {"threads": 1}},
        "unet": {
            "model": {"channels": [8, 16, 32, 64]},
            "train": {"steps": 200, "eval_every": 100, "iterations_per_epoch": 25},
            "launch": {"threads": 1},
        },
    },
}


@pytest.mark.slow
def test_demo_pipeline_end_to_end(workflow_dir, demo_config):
    # README's "your own config" is the demo shrunk: as my_config.yaml (the README's name) and
    # as the workflow's config (what the commands without --configfile read)
    mine = merge_config(demo_config, TINY)
    write_config(workflow_dir / "my_config.yaml", mine)
    write_config(workflow_dir / "config" / "config.yaml", mine)
    tiny = workflow_dir / "my_config.yaml"
    dry = run_snakemake(workflow_dir, *README["dry-run"][1:])
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert job_counts(dry.stdout)["train_jets"] == 6  # 4 runs and particlenet's scaling study
    r = run_snakemake(workflow_dir, *README["run"][1:])  # no --cores: the default profile's
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = (workflow_dir / "results" / "summary" / "summary.md").read_text()
    for run in (
        "pfn_lr-0.001",
        "pfn_lr-0.003",
        "particlenet",
        "part",
        "unet_lr-0.001",
        "unet_lr-0.003",
    ):
        assert f"| {run}" in summary
    rows = list(csv.DictReader(open(workflow_dir / "results" / "summary" / "metrics.csv")))
    val = {(r["run"], r["metric"]): float(r["value"]) for r in rows if r["split"] == "test"}
    assert val[("pfn_lr-0.003", "auc_macro")] > 0.75
    assert val[("unet_lr-0.003", "dice_organ")] > 0.3
    for run in ("pfn_lr-0.001", "pfn_lr-0.003", "particlenet", "part"):
        m = json.loads(
            (
                workflow_dir / "results" / "toy_jets" / "runs" / run / "eval" / "metrics.json"
            ).read_text()
        )
        assert val[(run, "auc_macro")] == m["auc_macro"]
        assert 0.5 < m["baseline_jet_mass"]["auc_macro"] < 1
    figures = {p.name for p in (workflow_dir / "results" / "summary" / "figures").iterdir()}
    assert {"jets-toy_jets-roc.png", "volumes-toy_ct-dice.png", "pipeline-all-cost.png",
            "jets-toy_jets-scaling-particlenet.png",
            "pipeline-all-planner.png"} <= figures  # fmt: skip
    # two sizes: a speed-up against the cores each used, no power law through two points
    assert "### Scaling of particlenet: 2 sizes, so a speed-up, not a fit" in summary
    assert "| particlenet_scale-2 | 2 |" in summary and "−-" not in summary
    assert "| device_hours | energy_kwh | peak_memory_gib |" in summary
    assert "Energy not measured: no GPU, so no NVML" in summary
    # every rule left a log and a benchmark
    # 26 jobs besides one preprocess_case job for each of the 7 cases
    assert len(list((workflow_dir / "logs" / "preprocess_case").rglob("*.log"))) == 7
    assert len(list((workflow_dir / "logs").rglob("*.log"))) == 26 + 7
    assert len(list((workflow_dir / "results" / "benchmarks").rglob("*.tsv"))) == 26 + 7
    # the planner profiled the runs before training; the summary sets its predictions beside
    # what the runs measured (particlenet's scaling study included)
    assert "## The planner against the runs" in summary
    assert "| particlenet_scale-2 | 2 |" in summary
    # each row is the plan's own-size prediction of the whole training job beside the job's
    # wall time (its benchmark file), the error their ratio; how near they come is a timing (it
    # moves with whatever else shares the cores) and is measured by benchmarks/job_prediction.py
    # and benchmarks/README.md, not here
    table = summary[summary.index("## The planner against the runs") :]
    rate, secs = r"([\d.e+]+) \w+/s", r"([\d.e+]+) s"
    rows = re.findall(rf"\| (\S+) \| (\d+) \| job \| {rate} \| {rate} \| {secs} / {secs} \| "
                      r"([+-]\d+)% \|", table)  # fmt: skip
    assert len(rows) == 8, table[:3000]
    plans = json.loads((workflow_dir / "results" / "plan" / "runs.json").read_text())
    own = {p["run"]: next(r for r in p["predictions"] if r.get("own")) for p in plans["runs"]}
    for run, procs, pred, _, pred_s, meas_s, err in rows:
        assert int(procs) == own[run]["processes_total"], (run, table[:3000])
        assert float(pred) == pytest.approx(own[run]["job_items_per_s"], rel=1e-3), run
        assert float(pred_s) == pytest.approx(own[run]["job_s"], rel=1e-2), run
        assert int(err) == pytest.approx(100 * (float(meas_s) / float(pred_s) - 1), abs=2), run
    assert (workflow_dir / "results" / "plan" / "runs.md").is_file()
    manifest = json.loads((workflow_dir / "resources" / "toy_jets" / "manifest.json").read_text())
    assert {f["entries"] for f in manifest["files"]} == {400}

    html = workflow_dir / "results" / "report.html"
    for command in (README["report-mine"], README["report"]):
        html.unlink(missing_ok=True)
        report = run_snakemake(workflow_dir, *command[1:])
        assert report.returncode == 0, report.stderr[-3000:]
        assert "summary.md" in html.read_text(errors="ignore")
    _the_report_opens_on_the_ranked_runs(html, workflow_dir)

    again = run_snakemake(workflow_dir, "-n", "--configfile", str(tiny))
    assert "Nothing to be done" in again.stdout + again.stderr
    # README's other plain runs: nothing left to do
    for command in (README["keep-going"], README["gpu-resources"], README["plan"]):
        done = run_snakemake(workflow_dir, *command[1:])
        assert done.returncode == 0 and "Nothing to be done" in _out(done), _out(done)[-2000:]
    agg = subprocess.run(README["aggregate"], cwd=workflow_dir, env=snakemake_env(),
                         capture_output=True, text=True)  # fmt: skip
    assert agg.returncode == 0, agg.stderr[-2000:]
    assert "| pfn_lr-0.003" in (workflow_dir / "results" / "summary" / "summary.md").read_text()

    # a sweep that grows, and repeats: only the new runs train (the others keep their names)
    cfg = yaml.safe_load(tiny.read_text())
    cfg["experiments"]["pfn"]["sweep"]["train.lr"] = [0.001, 0.003, 0.01]
    cfg["experiments"]["particlenet"]["repeats"] = 3
    write_config(tiny, cfg)
    dry = run_snakemake(workflow_dir, "-n", "-p", "--configfile", str(tiny))
    jobs = job_counts(_out(dry))
    assert {k: jobs.get(k) for k in ("train_jets", "evaluate_jets", "train_seg")} == {
        "train_jets": 3, "evaluate_jets": 3, "train_seg": None
    }, jobs  # fmt: skip
    for new in ("pfn_lr-0.01", "particlenet_rep-1", "particlenet_rep-2"):
        assert f"runs/{new}/model.pt" in dry.stdout
    cfg = yaml.safe_load(tiny.read_text())
    cfg["experiments"]["pfn"]["sweep"]["train.lr"] = [0.001, 0.003]
    cfg["experiments"]["particlenet"].pop("repeats")
    write_config(tiny, cfg)

    # a change of a training setting reruns that experiment's runs (and the planner, which
    # profiles the runs as configured), not the data stages
    cfg = yaml.safe_load(tiny.read_text())
    cfg["experiments"]["unet"]["train"]["weight_decay"] = 0.001
    write_config(tiny, cfg)
    jobs = job_counts(_out(run_snakemake(workflow_dir, "-n", "--configfile", str(tiny))))
    assert set(jobs) - {"all"} == {"train_seg", "evaluate_seg", "plan_runs", "aggregate"}, jobs
    assert jobs["train_seg"] == 2  # both runs of the unet sweep

    # a change of the shard config reshards and retrains the jets, but does not restage
    cfg["experiments"]["unet"]["train"].pop("weight_decay")
    cfg["datasets"]["toy_jets"]["jets"]["max_particles"] = 24
    write_config(tiny, cfg)
    jobs = job_counts(_out(run_snakemake(workflow_dir, "-n", "--configfile", str(tiny))))
    expected = {"shard_jets", "index_jets", "train_jets", "evaluate_jets", "plan_runs",
                "aggregate"}  # fmt: skip
    assert set(jobs) - {"all"} == expected, jobs
    assert jobs["train_jets"] == 6
    cfg["datasets"]["toy_jets"]["jets"]["max_particles"] = 32  # back to what was run
    write_config(tiny, cfg)

    # the shards and cases of this run given as source.prepared behind a slow URL (5 ms a
    # request): only training and evaluation run for them, reading through the fetch layer
    results = workflow_dir / "results"
    far = {
        "datasets": {
            "far_jets": {
                "domain": "jets",
                "source": {"prepared": f"latency://{results}/toy_jets/shards"},
                "read": {"storage_options": {"delay_s": 0.005}, "threads": 4, "block_mb": 0.25},
            },
            "far_ct": {
                "domain": "volumes",
                "source": {"prepared": f"latency://{results}/toy_ct/cases"},
                "read": {"storage_options": {"delay_s": 0.005}},
            },
        },
        "experiments": {
            "far-pfn": {
                "dataset": "far_jets",
                "model": {"name": "pfn", "phi_sizes": [32, 32], "f_sizes": [32]},
                "train": {"steps": 40, "eval_every": 20},
                "launch": {"gpus": 0, "threads": 1},
            },
            "far-unet": {
                "dataset": "far_ct",
                "model": {"name": "unet", "channels": [8, 16, 32, 64]},
                "train": {"steps": 10, "eval_every": 10, "iterations_per_epoch": 5},
                "launch": {"gpus": 0, "threads": 1},
            },
        },
    }
    far_cfg = write_config(workflow_dir / "far.yaml", far)
    targets = [
        "results/far_jets/runs/far-pfn/eval/metrics.json",
        "results/far_ct/runs/far-unet/eval/metrics.json",
    ]
    r = run_snakemake(
        workflow_dir, *targets, "--cores", "2", "--configfile", str(tiny), str(far_cfg)
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert set(job_counts(_out(r))) == {"train_jets", "evaluate_jets", "train_seg", "evaluate_seg"}
    m = json.loads((workflow_dir / targets[0]).read_text())
    assert m["auc_macro"] > 0.5 and "baseline_jet_mass" in m
    assert json.loads((workflow_dir / targets[1]).read_text())["n_cases"] >= 1
    assert not (results / "far_jets" / "shards").exists()

    # README's rerun commands: the shards and their index alone; re-staging, which copies
    # nothing already verified; retraining (a dry run: the runs, their evaluation, the summary)
    rerun = run_snakemake(workflow_dir, *README["rerun-shards"][1:])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert set(job_counts(_out(rerun))) - {"all"} == {"shard_jets", "index_jets"}
    # the volume preprocessing alone: one job a case and the gathering, nothing downstream
    prep = run_snakemake(workflow_dir, *README["rerun-preprocess"][1:])
    assert prep.returncode == 0, prep.stderr[-3000:]
    assert job_counts(_out(prep)) == {"preprocess_case": 7, "gather_cases": 1}
    restage = run_snakemake(workflow_dir, *README["restage"][1:])
    assert restage.returncode == 0, restage.stderr[-3000:]
    assert set(job_counts(_out(restage))) - {"all"} == {"stage"}
    for ds in ("toy_jets", "toy_ct"):  # the verified files stayed
        log = (workflow_dir / "logs" / "stage" / f"{ds}.log").read_text()
        assert re.search(r"stage: 0 of \d+ files copied", log), log[-500:]
    # byte-identical shards and manifests retrain nothing
    after = run_snakemake(workflow_dir, "-n")
    assert "Nothing to be done" in _out(after), _out(after)[-3000:]
    # a forced rerun of training trains afresh from step 0 (not the completed checkpoint)
    forced = run_snakemake(workflow_dir, *README["rerun-one-run"][1:])  # this run's job alone
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert job_counts(_out(forced)) == {"train_jets": 1}, _out(forced)[-3000:]
    log = (workflow_dir / "logs" / "train_jets" / "toy_jets" / "pfn_lr-0.003.log").read_text()
    assert "a forced rerun trains afresh" in log and "resumed from" not in log
    retrain = run_snakemake(workflow_dir, *README["rerun-train"][1:], "-n")
    assert retrain.returncode == 0, retrain.stderr[-3000:]
    jobs = job_counts(_out(retrain))
    assert jobs["train_jets"] == 6 and {"evaluate_jets", "aggregate"} <= set(jobs)
    assert "train_seg" not in jobs


def _out(result) -> str:
    return result.stdout + result.stderr


def _the_report_opens_on_the_ranked_runs(html, workflow_dir):
    """The report in headless Chromium: the page a user lands on shows each dataset's runs
    ranked (best first, marked ★) and the summary's figures, not only Snakemake's headings."""
    from browser import rendered

    dom = rendered(html, workflow_dir / "results" / "report.png")
    landing = dom[dom.index("voxjet-summary") :]
    for dataset in ("toy_jets", "toy_ct"):
        heading = landing.index(f"{dataset} (")
        table = landing[heading : landing.index("</table>", heading)]
        rows = [re.findall(r"<td>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]
        assert len(rows) >= 2 and "★" in rows[0][1], table[:2000]
        assert [row[0] for row in rows] == [str(i) for i in range(1, len(rows) + 1)]
        headline = [float(row[4]) for row in rows]  # auc_macro, dice_mean: best first
        assert headline == sorted(headline, reverse=True), table[:2000]
    assert landing.count('src="data:image/png;base64,') >= 5

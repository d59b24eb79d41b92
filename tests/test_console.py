"""What a user reads on the console: running jobs' progress lines (voxjet.watch, read by voxjet's
Snakemake logger), a failure said once and last (voxjet.failures), a config file that cannot be
read said in one line with its line and column (voxjet.config_file), and the same through a
real `snakemake` run with the logger the profiles set."""

from __future__ import annotations

import io
import logging

import awkward as ak
import pytest
import uproot
from conftest import REPO, copy_workflow, run_snakemake, write_config

from voxjet.config_file import config_file_problem, read_config_file
from voxjet.errors import VoxjetError
from voxjet.failures import config_error_line, configfiles_of, job_failure, last_message, one_line
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.progress import Progress, interval, latest_line
from voxjet.watch import RunningJobs


def _progress_lines(n: int, desc: str = "train pfn") -> str:
    out = io.StringIO()
    p = Progress(total=n, desc=desc, unit="step", interval_s=0.0, stream=out)
    for _ in range(n):
        p.update(1)
    p.close()
    return out.getvalue()


def test_latest_line_finds_what_progress_writes_and_nothing_else():
    text = "loading shards\n" + _progress_lines(3) + "saved model.pt\n"
    line = latest_line(text)
    assert line is not None and line.startswith("train pfn: 3/3 step, ") and "elapsed" in line
    assert latest_line("epoch 3 done: loss 0.3\nTraceback (most recent call last):\n") is None


def test_the_interval_is_short_at_first_and_half_a_minute_later():
    assert interval(0) == 5 and interval(60) == 15 and interval(3600) == 30


def test_running_jobs_show_new_lines_spaced_by_the_jobs_age(tmp_path):
    log = tmp_path / "train.log"
    jobs = RunningJobs(most=4)
    jobs.started(7, "train_jets pfn", str(log), now=0.0)
    assert jobs.due(now=1.0) == []  # no log yet: a queued cluster job
    log.write_text("setting up\n" + _progress_lines(2))
    (first,) = jobs.due(now=11.0)
    assert first.startswith("    job 7 (train_jets pfn): train pfn: 2/2 step")
    assert jobs.due(now=12.0) == []  # nothing new
    with log.open("a") as f:
        f.write(_progress_lines(4))
    assert jobs.due(now=15.0) == []  # new, but the last line is 4 s old
    assert len(jobs.due(now=30.0)) == 1
    jobs.ended(7)
    with log.open("a") as f:
        f.write(_progress_lines(5))
    assert jobs.due(now=100.0) == []


def test_lines_written_one_at_a_time_each_reach_the_console(tmp_path):
    """A training log grows by one progress line between two looks (and a line can be half
    written when looked at): each complete line is read whole, none dropped."""
    log = tmp_path / "train.log"
    log.write_text("launch: 1 process(es) a node on cpu\n")
    jobs = RunningJobs(longest=1, shortest=1)
    jobs.started(3, "train_jets part", str(log), now=0.0)
    assert jobs.due(now=1.0) == []
    shown, lines = [], _progress_lines(3).splitlines(keepends=True)
    for i, line in enumerate(lines):
        half = len(line) // 2
        with log.open("a") as f:
            f.write(line[:half])
        shown += jobs.due(now=10.0 * i + 5)
        with log.open("a") as f:
            f.write(line[half:])
        shown += jobs.due(now=10.0 * i + 10)
    assert [s.split("): ", 1)[1] for s in shown] == [line.strip() for line in lines]
    assert len(lines) >= 3


def test_a_finished_jobs_last_line_is_said_once_if_it_was_watched(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(_progress_lines(1))
    jobs = RunningJobs()
    jobs.started(1, "train_jets pfn", str(log), now=0.0)
    jobs.started(2, "preprocess_case c", str(tmp_path / "quiet.log"), now=0.0)
    assert len(jobs.due(now=6.0)) == 1
    with log.open("a") as f:
        f.write(_progress_lines(3))
    (last,) = jobs.finished(1)
    assert "3/3 step" in last and jobs.finished(1) == []
    assert jobs.finished(2) == []  # never shown a line: a short job stays quiet


def test_many_running_jobs_are_counted_not_listed(tmp_path):
    jobs = RunningJobs(most=2)
    for i in range(5):
        log = tmp_path / f"{i}.log"
        log.write_text(_progress_lines(2, desc=f"preprocess case_{i}"))
        jobs.started(i, f"preprocess_case case_{i}", str(log), now=0.0)
    lines = jobs.due(now=20.0)
    assert len(lines) == 3 and lines[-1].startswith("    … and 3 more running jobs")


def test_a_truncated_log_a_retry_wrote_is_read_again(tmp_path):
    log = tmp_path / "t.log"
    log.write_text(_progress_lines(8) * 20)
    jobs = RunningJobs()
    jobs.started(1, "train", str(log), now=0.0)
    assert len(jobs.due(now=20.0)) == 1
    log.write_text(_progress_lines(1, desc="train again"))
    (line,) = jobs.due(now=60.0)
    assert "train again: 1/1 step" in line


def test_a_message_of_several_lines_becomes_one():
    assert one_line(
        [
            "voxjet shard-jets: error: files disagree:",
            "  a.root: 3 branches",
            "",
            "  b.root: 4 branches",
        ]
    ) == (  # fmt: skip
        "voxjet shard-jets: error: files disagree: a.root: 3 branches; b.root: 4 branches"
    )
    long = one_line(["voxjet x: error: " + "y" * 2000])
    assert len(long) < 760 and long.endswith("(the rest in the log)")


def test_the_last_voxjet_message_of_a_log_stops_at_the_traceback(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("voxjet train-jets: error: first try\nretrying\n"
                   "voxjet train-jets: error: index.json lists no parts:\n  rerun shard_jets\n"
                   "Traceback (most recent call last):\n  File x\n")  # fmt: skip
    expected = "voxjet train-jets: error: index.json lists no parts: rerun shard_jets"
    assert last_message(log) == expected
    assert last_message(tmp_path / "none.log") is None
    assert job_failure("train_jets", None).endswith("no voxjet message; see the log")
    assert job_failure("train_jets", str(log)).startswith(f"voxjet: train_jets failed ({log}): ")


def test_configfiles_are_read_from_every_way_of_writing_them():
    argv = ["snakemake", "-n", "--configfile", "a.yaml", "b.yaml", "--cores", "2",
            "--configfiles=c.yaml", "all"]  # fmt: skip
    assert configfiles_of(argv) == ["a.yaml", "b.yaml", "c.yaml"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("datasets:\n  a: [1, 2\nexperiments: {}\n", "begun at line 2"),
        ("datasets:\n\ta: 1\n", "a tab in the indentation"),
        ("a: 1\n b: 2\n", "line 2, column"),
    ],
)
def test_a_yaml_error_is_one_line_with_its_line_and_column(tmp_path, text, expected):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    problem = config_file_problem(path)
    assert problem and "\n" not in problem and str(path) in problem and expected in problem
    with pytest.raises(VoxjetError, match="not valid YAML"):
        read_config_file(path)


def test_a_missing_or_odd_config_file_is_named(tmp_path):
    assert "does not exist (looked for" in config_file_problem(tmp_path / "nope.yaml")
    assert "is a folder" in config_file_problem(tmp_path)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(VoxjetError, match="not a mapping"):
        read_config_file(tmp_path / "list.yaml")
    (tmp_path / "ok.json").write_text('{"a": 1,}')
    assert "line 1, column 9: not valid JSON" in config_file_problem(tmp_path / "ok.json")
    message = "Config file is not valid JSON or YAML. In case of YAML, make sure ..."
    line = config_error_line(message, ["snakemake", "--configfile", str(tmp_path / "nope.yaml")])
    assert line and line.startswith("voxjet: config file ")
    assert config_error_line("MissingInputException: ...", ["snakemake"]) is None


def test_the_logger_prints_a_failed_jobs_message_last_and_once(tmp_path):
    """The plugin without Snakemake: records as Snakemake's scheduler sends them."""
    from snakemake_interface_logger_plugins.common import LogEvent
    from snakemake_interface_logger_plugins.settings import OutputSettingsLoggerInterface

    from snakemake_logger_plugin_voxjet import LogHandler, LogHandlerSettings

    class Common(OutputSettingsLoggerInterface):
        printshellcmds = nocolor = stdout = True
        debug_dag = dryrun = verbose = quiet = False
        show_failed_logs = False

    log = tmp_path / "shard.log"
    log.write_text("voxjet shard-jets: error: jet_sdmass: 3 values far outside\n")
    out = io.StringIO()
    handler = LogHandler(common_settings=Common(), settings=LogHandlerSettings(interval=0))
    handler.console.stream = out
    handler.setFormatter(logging.Formatter("%(message)s"))

    def record(**extra):
        return logging.makeLogRecord({"levelno": logging.INFO, "levelname": "INFO", **extra})

    handler.emit(record(msg="job 3", event=LogEvent.JOB_INFO, jobid=3, rule_name="shard_jets",
                        wildcards={"dataset": "j"}, log=[str(log)]))  # fmt: skip
    handler.emit(record(msg="Error in rule shard_jets", event=LogEvent.JOB_ERROR, jobid=3,
                        rule_name="shard_jets", levelno=logging.ERROR))  # fmt: skip
    handler.emit(record(msg="RuleException: CalledProcessError in file ...", levelno=logging.ERROR,
                        event=LogEvent.ERROR))  # fmt: skip
    handler.emit(record(msg="At least one job did not complete successfully.",
                        levelno=logging.ERROR))  # fmt: skip
    handler.close()
    lines = out.getvalue().strip().splitlines()
    assert "CalledProcessError" not in out.getvalue()
    assert lines[-1] == (f"voxjet: shard_jets failed ({log}): voxjet shard-jets: error: "
                         "jet_sdmass: 3 values far outside")  # fmt: skip
    assert sum("jet_sdmass" in line for line in lines) == 1


def _outlier_workflow(root):
    """A two-class jets workflow whose source holds 1e30 jet masses, with `outliers: fail`."""
    wf = copy_workflow(root / "wf")
    generate_dataset(wf / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=1,
                     jets_per_file=300, seed=5), progress=False)  # fmt: skip
    path = wf / "src" / "Wqq_000.root"
    with uproot.open(path) as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    mass = ak.to_numpy(fields["jet_sdmass"]).copy()
    mass[[5, 10, 15]] = 1e30
    fields["jet_sdmass"] = ak.Array(mass)
    with uproot.recreate(path) as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)
    cfg = {"datasets": {"j": {"domain": "jets", "source": {"path": "src"},
                              "jets": {"labels": ["label_QCD", "label_Wqq"], "max_particles": 16,
                                       "outliers": "fail"}}},
           "experiments": {"pfn": {"dataset": "j", "model": {"name": "pfn", "phi_sizes": [16],
                                                             "f_sizes": [16]},
                                   "train": {"steps": 4, "eval_every": 2, "batch_size": 32},
                                   "launch": {"gpus": 0, "threads": 1}}}}  # fmt: skip
    write_config(wf / "mine.yaml", cfg)
    return wf


@pytest.mark.slow
def test_a_job_failing_on_an_outlier_ends_the_console_with_its_message_once(tmp_path):
    """The issue's case: `jets.outliers: fail`, a 1e30 jet mass; voxjet's message once, among
    the last 3 console lines, Snakemake's summary above it; no CalledProcessError traceback."""
    wf = _outlier_workflow(tmp_path)
    r = run_snakemake(wf, "--cores", "2", "--configfile", "mine.yaml")
    assert r.returncode != 0
    console = (r.stdout + r.stderr).strip().splitlines()
    mine = [i for i, line in enumerate(console) if line.startswith("voxjet: ")]
    assert len(mine) == 1 and mine[0] >= len(console) - 3, console[-10:]
    assert "jet_sdmass" in console[mine[0]] and "jets.outliers: warn" in console[mine[0]]
    assert "1e+30" in console[mine[0]] and "Wqq_000.root" in console[mine[0]]
    assert "CalledProcessError" not in r.stderr
    verbose = run_snakemake(wf, "--cores", "2", "--configfile", "mine.yaml", "--verbose")
    assert "Traceback" in verbose.stderr  # still there for whoever asks


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("nope.yaml", None, "voxjet: config file nope.yaml does not exist"),
        ("bad.yaml", "datasets:\n  j: {domain: jets\nexperiments: {}\n", "begun at line 2"),
        ("tab.yaml", "datasets:\n\tj: 1\n", "a tab in the indentation"),
    ],
)
def test_a_config_file_snakemake_cannot_read_is_one_line(workflow_dir, name, text, expected):
    if text is not None:
        (workflow_dir / name).write_text(text)
    r = run_snakemake(workflow_dir, "-n", "--configfile", name)
    assert r.returncode != 0
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    # a dry run writes Snakemake's console to stdout, a real run to stderr
    stream = r.stdout if "voxjet: " in r.stdout else r.stderr
    last = stream.strip().splitlines()[-1]
    assert last.startswith("voxjet: ") and expected in last, r.stdout + r.stderr[-2000:]
    verbose = run_snakemake(workflow_dir, "-n", "--configfile", name, "--verbose")
    assert "Traceback" in verbose.stdout + verbose.stderr


def test_aggregate_from_a_bad_config_or_results_folder_is_one_line(tmp_path, capsys):
    from voxjet.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets:\n  j: [1\n")
    assert main(["aggregate", "--from-config", str(bad), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "line 2" in err[0], err
    good = REPO / "config" / "config.yaml"
    assert main(["aggregate", "--from-config", str(good), "--results", str(tmp_path / "none"),
                 "--out", str(tmp_path / "s")]) == 2  # fmt: skip
    assert "--results" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()

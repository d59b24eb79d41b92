# Every run's metrics → results/summary/{metrics.csv, summary.md, figures/}. The runs come in a
# file (list_runs), never on a command line. Benchmark files of the earlier rules are read too
# (they exist once those jobs ran) for the cost figure.


rule list_runs:
    output:
        paths.RUN_LIST,
    params:
        runs=G.aggregate_runs(),
    log:
        "logs/list_runs/list_runs.log",
    benchmark:
        "results/benchmarks/list_runs/list_runs.tsv"
    localrule: True
    threads: 1
    resources:
        **G.cpu_job(mem_mb=1000, runtime=5),
    conda:
        ENV
    script:
        "../scripts/list_runs.py"


rule aggregate:
    input:
        runs=rules.list_runs.output[0],
        plan=rules.plan_runs.output.json,
        evals=G.evaluations(),
        train_logs=G.train_logs(),
        best=G.best_targets(),
        ledger=ledgers(
            paths.RUN_LIST, paths.RUN_PLAN, G.evaluations(), G.train_logs(), G.best_targets()
        ),
    output:
        csv=report(
            f"{paths.SUMMARY}/metrics.csv",
            caption="../report/metrics.rst",
            category="Summary",
        ),
        md=report(
            f"{paths.SUMMARY}/summary.md",
            caption="../report/summary.rst",
            category="Summary",
        ),
        html=report(
            f"{paths.SUMMARY}/summary.html",
            caption="../report/summary.rst",
            category="Summary",
        ),
        figures=report(
            directory(f"{paths.SUMMARY}/figures"),
            patterns=["{domain}-{dataset}-{figure}.png"],
            caption="../report/figures.rst",
            category="{domain}",
            subcategory="{dataset}",
            labels={"figure": "{figure}"},
        ),
    log:
        "logs/aggregate/aggregate.log",
    benchmark:
        "results/benchmarks/aggregate/aggregate.tsv"
    threads: 1
    resources:
        **G.cpu_job(mem_mb=2000, runtime=10),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- aggregate --runs @{input.runs:q} --out results/summary"
        " --benchmarks results/benchmarks --plan {input.plan:q} --best {input.best:q}"

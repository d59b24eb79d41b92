# Every run's metrics → results/summary/{metrics.csv, summary.md}.


rule aggregate:
    input:
        eval_targets(),
    output:
        csv=report(
            "results/summary/metrics.csv",
            caption="../report/metrics.rst",
            category="Summary",
        ),
        md=report(
            "results/summary/summary.md",
            caption="../report/summary.rst",
            category="Summary",
        ),
    params:
        runs=aggregate_runs(),
    log:
        "logs/aggregate/aggregate.log",
    benchmark:
        "results/benchmarks/aggregate/aggregate.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        ENV
    shell:
        "voxjet aggregate --runs {params.runs:q} --out results/summary > {log} 2>&1"

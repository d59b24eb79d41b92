# Every run's metrics → results/summary/{metrics.csv, summary.md}.


rule aggregate:
    input:
        eval_targets(),
    output:
        csv="results/summary/metrics.csv",
        md="results/summary/summary.md",
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

# Before training: each run profiled for a few steps on one device, its step time predicted at
# the sizes the site allows, and a sweep allocated to the GPU budget → results/plan/runs.{json,md}
# (`snakemake --until plan_runs`). The aggregate checks the predictions against what trained.


checkpoint plan_runs:
    input:
        data=plan_inputs(),
        ledger=ledgers(lambda wildcards: plan_inputs()),
    output:
        json="results/plan/runs.json",
        md=report("results/plan/runs.md", caption="../report/plan.rst", category="Plan"),
    params:
        runs=plan_run_list(),
        site=config["site"],
    log:
        "logs/plan_runs/plan_runs.log",
    benchmark:
        "results/benchmarks/plan_runs/plan_runs.tsv"
    # each profile runs with the threads one of its run's processes trains with
    threads: plan_threads()
    resources:
        mem_mb=8000,
        runtime=30,
        **site_resources(plan_gpus()),
    conda:
        ENV
    script:
        "../scripts/plan_runs.py"

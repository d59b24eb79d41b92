# Before training: each run profiled for a few steps on one device, its step time predicted at
# the sizes the site allows, and a sweep allocated to the GPU budget → results/plan/runs.{json,md}
# (`snakemake --until plan_runs`). The aggregate checks the predictions against what trained; an
# experiment with `launch.gpus: auto` waits for it and asks for the GPUs it chose.


rule plan_runs:
    input:
        data=G.plan_inputs(),
        ledger=ledgers(G.plan_inputs()),
    output:
        json=paths.RUN_PLAN,
        md=report(paths.RUN_PLAN_MD, caption="../report/plan.rst", category="Plan"),
    params:
        runs=G.planner_runs(),
        site=config["site"],
    log:
        "logs/plan_runs/plan_runs.log",
    benchmark:
        "results/benchmarks/plan_runs/plan_runs.tsv"
    # each profile runs with the threads one of its run's processes trains with
    threads: G.planner_threads()
    resources:
        **G.planner_job(mem_mb=8000, runtime=30),
    conda:
        ENV
    script:
        "../scripts/plan_runs.py"

# Volumes: staged images (MSD or nnU-Net v2 layout) → check every case, fingerprint, plan →
# one job a case (a chunked HDF5 file) → gather; in `cases/` at the plan's spacing, and in
# `cases_3d_lowres/` at the 3d_lowres configuration's where an experiment trains it. The cases
# come from dataset.json at the dry run, so the whole DAG is known from the start (and
# `--until gather_cases` or `-R preprocess_case` rerun exactly the preprocessing).


rule plan_volumes:
    input:
        manifest=staged_manifest,
        ledger=ledgers(rules.stage.output[0]),
    output:
        directory("results/{dataset}/plan"),
    params:
        staged=manifest_digest,
        config=data_config("volumes"),
        # planning compares the cases' images (the stage cannot: label files may repeat)
        on_duplicate=lambda wildcards: dataset_cfg(wildcards.dataset)["source"].get(
            "on_duplicate", "fail"
        ),
    log:
        "logs/plan_volumes/{dataset}.log",
    benchmark:
        "results/benchmarks/plan_volumes/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- plan-volumes --manifest {input.manifest} --out {output}"
        " --config {params.config:q} --on-duplicate {params.on_duplicate}"


rule preprocess_case:
    input:
        manifest=staged_manifest,
        plan=rules.plan_volumes.output[0],
        ledger=ledgers(rules.stage.output[0], rules.plan_volumes.output[0]),
    output:
        "results/{dataset}/{cases}/{case}.h5",
    params:
        staged=manifest_digest,
        configuration=lambda wildcards: CONFIGURATION_OF_CASES[wildcards.cases],
    log:
        "logs/preprocess_case/{dataset}/{cases}/{case}.log",
    benchmark:
        "results/benchmarks/preprocess_case/{dataset}/{cases}/{case}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
        cases=one_of(CONFIGURATION_OF_CASES),
        case="[A-Za-z0-9_.+-]+",
    # on a cluster, `--group-components preprocess=N` (the slurm profile) runs N cases a job
    group:
        "preprocess"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=30,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- preprocess-case --manifest {input.manifest} --plan {input.plan}"
        " --case {wildcards.case} --configuration {params.configuration} --out {output}"


rule gather_cases:
    input:
        plan=rules.plan_volumes.output[0],
        cases=case_files,
        ledger=ledgers(rules.plan_volumes.output[0], case_files),
    output:
        "results/{dataset}/{cases}/cases.json",
    log:
        "logs/gather_cases/{dataset}/{cases}.log",
    benchmark:
        "results/benchmarks/gather_cases/{dataset}/{cases}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
        cases=one_of(CONFIGURATION_OF_CASES),
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- gather-cases --plan {input.plan}"
        " --cases results/{wildcards.dataset}/{wildcards.cases}"

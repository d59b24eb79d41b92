# Volumes: staged images (MSD or nnU-Net v2 layout) → check every case, fingerprint, plan →
# one job a case (a chunked HDF5 file) → gather; in `cases/` at the plan's spacing, and in
# `cases_3d_lowres/` at the 3d_lowres configuration's where an experiment trains it. The cases
# come from dataset.json at the dry run, so the whole DAG is known from the start. A case file
# that is current (made from its sources and plan as the dry run knows them) takes its inputs as
# `ancient`: a changed case redoes that case alone while the plan stays as it was; gather_cases
# refuses case files made with an earlier plan, and the next run rebuilds them.


rule plan_volumes:
    input:
        manifest=paths.MANIFEST,
        ledger=ledgers(paths.MANIFEST),
    output:
        directory(paths.VOLUME_PLAN),
    params:
        made_from=of_dataset(G.plan_digest),
        config=data_section("volumes"),
        # planning compares the cases' images (the stage cannot: label files may repeat)
        on_duplicate=lambda wildcards: G.dataset(wildcards.dataset)["source"].get(
            "on_duplicate", "fail"
        ),
    log:
        "logs/plan_volumes/{dataset}.log",
    benchmark:
        "results/benchmarks/plan_volumes/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
    threads: 1
    resources:
        **G.cpu_job(mem_mb=8000, runtime=120),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- plan-volumes --manifest {input.manifest} --out {output}"
        " --config {params.config:q} --on-duplicate {params.on_duplicate}"


rule preprocess_case:
    input:
        manifest=case_input(paths.MANIFEST),
        plan=case_input(paths.VOLUME_PLAN),
        ledger=ledgers(paths.MANIFEST, paths.VOLUME_PLAN),
    output:
        paths.CASE,
    params:
        made_from=lambda wildcards: G.case_digest(wildcards.dataset, wildcards.case),
        plan=lambda wildcards: G.case_plan(wildcards.dataset, wildcards.cases, wildcards.case),
        configuration=lambda wildcards: CONFIGURATION_OF_CASES[wildcards.cases],
    log:
        "logs/preprocess_case/{dataset}/{cases}/{case}.log",
    benchmark:
        "results/benchmarks/preprocess_case/{dataset}/{cases}/{case}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
        cases=one_of(CONFIGURATION_OF_CASES),
        case="[A-Za-z0-9_.+-]+",
    threads: 1
    resources:
        **G.cpu_job(mem_mb=8000, runtime=30),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- preprocess-case --manifest {input.manifest} --plan {input.plan}"
        " --case {wildcards.case} --configuration {params.configuration} --out {output}"
        " --made-from {params.made_from}"


rule gather_cases:
    input:
        plan=paths.VOLUME_PLAN,
        cases=lambda wildcards: G.case_outputs(wildcards.dataset, wildcards.cases),
        ledger=ledgers(
            paths.VOLUME_PLAN,
            lambda wildcards: G.case_outputs(wildcards.dataset, wildcards.cases),
        ),
    output:
        paths.CASES,
    params:
        configuration=lambda wildcards: CONFIGURATION_OF_CASES[wildcards.cases],
        folder=lambda wildcards: G.case_folder(wildcards.dataset, wildcards.cases),
    log:
        "logs/gather_cases/{dataset}/{cases}.log",
    benchmark:
        "results/benchmarks/gather_cases/{dataset}/{cases}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
        cases=one_of(CONFIGURATION_OF_CASES),
    threads: 1
    resources:
        **G.cpu_job(mem_mb=1000, runtime=10),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- gather-cases --plan {input.plan}"
        " --cases {params.folder} --configuration {params.configuration}"

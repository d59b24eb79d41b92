# Volumes: staged NIfTI (MSD layout) → fingerprint, plan and one chunked HDF5 file a case.


rule preprocess_volumes:
    input:
        manifest=rules.stage.output[0],
    output:
        directory("results/{dataset}/cases"),
    params:
        config=data_config("volumes"),
    log:
        "logs/preprocess_volumes/{dataset}.log",
    benchmark:
        "results/benchmarks/preprocess_volumes/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
    conda:
        ENV
    shell:
        "voxjet preprocess-volumes --manifest {input.manifest} --out {output}"
        " --config {params.config:q} > {log} 2>&1"

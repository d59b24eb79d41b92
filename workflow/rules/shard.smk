# Jets: staged ROOT files → shuffled HDF5 shards with index.json.


rule shard_jets:
    input:
        manifest=rules.stage.output[0],
    output:
        directory("results/{dataset}/shards"),
    params:
        config=data_config("jets"),
    log:
        "logs/shard_jets/{dataset}.log",
    benchmark:
        "results/benchmarks/shard_jets/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("jets")),
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
    conda:
        ENV
    shell:
        "voxjet shard-jets --manifest {input.manifest} --out {output}"
        " --config {params.config:q} > {log} 2>&1"

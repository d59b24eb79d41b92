# Jets: staged ROOT files → shuffled HDF5 shards with index.json. Scatter/gather: shard job k
# of jets.shard_jobs reads the k-th share of every file's entries; index_jets adds them up.


rule shard_jets:
    input:
        manifest=staged_manifest,
        ledger=ledgers(rules.stage.output[0]),
    output:
        directory("results/{dataset}/shards/part_{part}"),
    params:
        staged=manifest_digest,
        config=data_config("jets"),
    log:
        "logs/shard_jets/{dataset}/{part}.log",
    benchmark:
        "results/benchmarks/shard_jets/{dataset}/{part}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("jets")),
        part=r"\d{4}",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- shard-jets --manifest {input.manifest} --out {output} --part {wildcards.part}"
        " --config {params.config:q}"


rule index_jets:
    input:
        parts=shard_parts,
        ledger=ledgers(shard_parts),
    output:
        "results/{dataset}/shards/index.json",
    params:
        config=data_config("jets"),
    log:
        "logs/index_jets/{dataset}.log",
    benchmark:
        "results/benchmarks/index_jets/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("jets")),
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- index-shards --parts {input.parts} --out {output}"
        " --config {params.config:q}"

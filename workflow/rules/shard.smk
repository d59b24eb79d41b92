# Jets: staged ROOT files → shuffled HDF5 shards with index.json. Scatter/gather: shard job k
# of jets.shard_jobs reads the k-th share of every file's entries; index_jets adds them up.


rule shard_jets:
    input:
        manifest=paths.MANIFEST,
        ledger=ledgers(paths.MANIFEST),
    output:
        directory(paths.SHARD_PART),
    params:
        sources=of_dataset(G.source_digest),
        config=data_section("jets"),
    log:
        "logs/shard_jets/{dataset}/{part}.log",
    benchmark:
        "results/benchmarks/shard_jets/{dataset}/{part}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("jets")),
        part=r"\d{4}",
    threads: 1
    resources:
        **G.cpu_job(mem_mb=8000, runtime=120),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- shard-jets --manifest {input.manifest} --out {output} --part {wildcards.part}"
        " --config {params.config:q}"


rule index_jets:
    input:
        parts=of_dataset(G.shard_parts),
        ledger=ledgers(of_dataset(G.shard_parts)),
    output:
        paths.SHARD_INDEX,
    params:
        config=data_section("jets"),
    log:
        "logs/index_jets/{dataset}.log",
    benchmark:
        "results/benchmarks/index_jets/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("jets")),
    threads: 1
    resources:
        **G.cpu_job(mem_mb=1000, runtime=10),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- index-shards --parts {input.parts} --out {output}"
        " --config {params.config:q}"

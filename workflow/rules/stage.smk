# Copy each dataset to fast storage, verified by checksum; the manifest is written last.


rule stage:
    input:
        sources=stage_input,
        ledger=ledgers(synthetic_source),
    output:
        "resources/{dataset}/manifest.json",
    params:
        source=stage_source,
        dest=lambda wildcards: f"resources/{wildcards.dataset}/data",
        options=stage_options,
        sources=source_state,
        workers=config["stage"]["workers"],
        retries=config["stage"]["retries"],
    log:
        "logs/stage/{dataset}.log",
    benchmark:
        "results/benchmarks/stage/{dataset}.tsv"
    threads: 2
    resources:
        mem_mb=2000,
        runtime=240,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- stage {params.source} --dest {params.dest} --manifest {output}"
        " --workers {params.workers} --retries {params.retries} {params.options}"

# Copy each dataset to fast storage, verified by checksum; the manifest is written last. A checkpoint: what reads the manifest is judged again once the
# stage has run, by the manifest's content (staged_manifest, manifest_digest), so sources that
# were touched, copied without their times or moved rerun the stage's verification and nothing
# after it, while a changed source reruns everything built from it.


checkpoint stage:
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
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- stage {params.source} --dest {params.dest} --manifest {output}"
        " --workers {params.workers} --retries {params.retries} {params.options}"

# Copy each dataset to fast storage, verified by checksum; the manifest is written last. A local
# source's stage reruns by its files' content as the dry run knows it (voxjet.stage.fingerprint,
# in params), not by their times: a touched, copied or moved source reruns only verify_sources,
# which nothing waits for; a changed one reruns the stage and what reads it, in the same run.


rule stage:
    input:
        sources=stage_sources,
        ledger=ledgers(of_dataset(G.generated)),
    output:
        paths.MANIFEST,
    params:
        made_from=of_dataset(G.source_digest),
        source=of_dataset(G.stage_source),
        dest=of_dataset(G.staged_folder),
        options=of_dataset(G.stage_options),
        workers=config["stage"]["workers"],
        retries=config["stage"]["retries"],
    log:
        "logs/stage/{dataset}.log",
    benchmark:
        "results/benchmarks/stage/{dataset}.tsv"
    threads: 2
    resources:
        **G.cpu_job(mem_mb=2000, runtime=240),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- stage {params.source} --dest {params.dest} --manifest {output}"
        " --workers {params.workers} --retries {params.retries} {params.options}"


# A local source's files with new times checked against their staged copies (their full
# checksums): the ledger takes the new times, or a change the quick fingerprints missed is
# recorded and the job stops, so the next run restages the file and rebuilds what read it.
rule verify_sources:
    input:
        sources=of_dataset(G.stage_input),
        manifest=paths.MANIFEST,
    output:
        paths.VERIFIED,
    params:
        source=lambda wildcards: G.dataset(wildcards.dataset)["source"]["path"],
        dest=of_dataset(G.staged_folder),
        patterns=of_dataset(G.stage_patterns),
    log:
        "logs/verify_sources/{dataset}.log",
    benchmark:
        "results/benchmarks/verify_sources/{dataset}.tsv"
    threads: 1
    resources:
        **G.cpu_job(mem_mb=1000, runtime=240),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- verify-sources --source {params.source:q}"
        " --dest {params.dest} --pattern {params.patterns:q} --out {output}"

# Demo data: jets from Pythia 8 (or the toy generator) as ROOT files in the JetClass schema, and
# toy CT volumes in the MSD layout.


rule synth_jets:
    output:
        directory(paths.SYNTHETIC),
    params:
        args=of_dataset(G.synth_args),
    log:
        "logs/synth_jets/{dataset}.log",
    benchmark:
        "results/benchmarks/synth_jets/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("jets")),
    threads: 2
    resources:
        **G.cpu_job(mem_mb=2000, runtime=30),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- synth-jets --out {output} --workers {threads} {params.args}"


rule synth_volumes:
    output:
        directory(paths.SYNTHETIC),
    params:
        args=of_dataset(G.synth_args),
    log:
        "logs/synth_volumes/{dataset}.log",
    benchmark:
        "results/benchmarks/synth_volumes/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
    threads: 1
    resources:
        **G.cpu_job(mem_mb=2000, runtime=30),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- synth-volumes --out {output} {params.args}"

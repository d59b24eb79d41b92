# One job a run (a sweep of n values is n jobs); torchrun starts one process a GPU.
# Checkpoints live beside the declared outputs, so a killed or preempted job resumes.


rule train_jets:
    input:
        data=of_dataset(G.data_input, paths.SHARD_INDEX),
        plan=of_run(G.plan_for_auto),
        ledger=ledgers(of_dataset(G.data_input, paths.SHARD_INDEX), of_run(G.plan_for_auto)),
    output:
        model=paths.MODEL,
        metrics=paths.TRAIN_LOG,
    params:
        data=of_run(G.run_location),
        read=of_dataset(G.read_options),
        run_config=of_run(G.run_config),
        launch=lambda wildcards: G.launch(wildcards.run).args(),
        run_dir=of_run(G.run_dir),
    log:
        "logs/train_jets/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/train_jets/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("jets")),
        run=one_of(G.runs_of("jets")),
    threads: lambda wildcards: G.launch(wildcards.run).threads
    resources:
        **RUN_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} --"
        " train-jets --shards {params.data:q} --read {params.read:q}"
        " --run-config {params.run_config:q} --out {params.run_dir}"


rule train_seg:
    input:
        data=seg_data_input,
        plan=of_run(G.plan_for_auto),
        # a cascade waits for every fold of its 3d_lowres experiment
        previous=of_run(G.previous_inputs, False),
        ledger=ledgers(seg_data_input, of_run(G.plan_for_auto), of_run(G.previous_inputs, False)),
    output:
        model=paths.MODEL,
        metrics=paths.TRAIN_LOG,
    params:
        data=of_run(G.run_location),
        read=of_dataset(G.read_options),
        run_config=of_run(G.run_config),
        launch=lambda wildcards: G.launch(wildcards.run).args(),
        run_dir=of_run(G.run_dir),
        previous=of_run(G.previous_args, False),
    log:
        "logs/train_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/train_seg/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
        run=one_of(G.runs_of("volumes")),
    threads: lambda wildcards: G.launch(wildcards.run).threads
    resources:
        **RUN_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} --"
        " train-seg --cases {params.data:q} --read {params.read:q} {params.previous}"
        " --run-config {params.run_config:q} --out {params.run_dir}"

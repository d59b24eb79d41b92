# One job a run (a sweep of n values is n jobs); torchrun starts one process a GPU.
# Checkpoints live beside the declared outputs, so a killed or preempted job resumes.


rule train_jets:
    input:
        data=data_input(rules.index_jets.output[0]),
        plan=plan_for_auto,
        ledger=ledgers(data_input(rules.index_jets.output[0]), plan_for_auto),
    output:
        model="results/{dataset}/runs/{run}/model.pt",
        metrics="results/{dataset}/runs/{run}/metrics.jsonl",
    params:
        data=data_location,
        read=read_options,
        run_config=run_config,
        launch=launch_args,
        run_dir=run_dir(),
    log:
        "logs/train_jets/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/train_jets/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("jets")),
        run=one_of([r.run_id for r in runs_of("jets")]),
    threads: lambda wildcards: run_launch(wildcards).threads
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
        plan=plan_for_auto,
        # a cascade waits for every fold of its 3d_lowres experiment
        previous=previous_inputs(test=False),
        ledger=ledgers(seg_data_input, plan_for_auto, previous_inputs(test=False)),
    output:
        model="results/{dataset}/runs/{run}/model.pt",
        metrics="results/{dataset}/runs/{run}/metrics.jsonl",
    params:
        data=data_location,
        read=read_options,
        run_config=run_config,
        launch=launch_args,
        run_dir=run_dir(),
        previous=previous_args(test=False),
    log:
        "logs/train_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/train_seg/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
        run=one_of([r.run_id for r in runs_of("volumes")]),
    threads: lambda wildcards: run_launch(wildcards).threads
    resources:
        **RUN_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} --"
        " train-seg --cases {params.data:q} --read {params.read:q} {params.previous}"
        " --run-config {params.run_config:q} --out {params.run_dir}"

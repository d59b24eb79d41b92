# Score each run on its dataset's held-out test split.


rule evaluate_jets:
    input:
        data=of_dataset(G.data_input, paths.SHARD_INDEX),
        model=paths.MODEL,
        plan=of_run(G.plan_for_auto),
        ledger=ledgers(
            of_dataset(G.data_input, paths.SHARD_INDEX), paths.MODEL, of_run(G.plan_for_auto)
        ),
    output:
        metrics=paths.EVAL_METRICS,
        predictions=f"{paths.EVAL}/predictions.h5",
        roc=report(
            f"{paths.EVAL}/roc.png",
            caption="../report/roc_run.rst",
            category="jets",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "ROC"},
        ),
        confusion=report(
            f"{paths.EVAL}/confusion.png",
            caption="../report/confusion.rst",
            category="jets",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "confusion matrix"},
        ),
    params:
        data=of_run(G.run_location),
        read=of_dataset(G.read_options),
        launch=lambda wildcards: G.launch(wildcards.run).args(),
        out=of_run(G.run_dir, "eval"),
    log:
        "logs/evaluate_jets/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/evaluate_jets/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("jets")),
        run=one_of(G.runs_of("jets")),
    # the experiment's processes and GPUs score the test split side by side
    threads: lambda wildcards: G.launch(wildcards.run).threads
    resources:
        **RUN_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} --"
        " evaluate-jets --shards {params.data:q} --read {params.read:q}"
        " --model {input.model} --out {params.out}"


rule evaluate_seg:
    input:
        data=seg_data_input,
        model=paths.MODEL,
        plan=of_run(G.plan_for_auto),
        previous=of_run(G.previous_inputs, True),
        ledger=ledgers(
            seg_data_input,
            paths.MODEL,
            of_run(G.plan_for_auto),
            of_run(G.previous_inputs, True),
        ),
    output:
        metrics=paths.EVAL_METRICS,
        overlays=report(
            f"{paths.EVAL}/overlays.png",
            caption="../report/overlays.rst",
            category="volumes",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "overlays"},
        ),
    params:
        data=of_run(G.run_location),
        read=of_dataset(G.read_options),
        launch=lambda wildcards: G.launch(wildcards.run).args(),
        out=of_run(G.run_dir, "eval"),
        overlap=run_evaluate("overlap"),
        mirror=mirror_option,
        previous=of_run(G.previous_args, True),
    log:
        "logs/evaluate_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/evaluate_seg/{dataset}/{run}.tsv"
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
        " evaluate-seg --cases {params.data:q} --read {params.read:q} --model {input.model}"
        " --overlap {params.overlap} {params.mirror} {params.previous} --out {params.out}"


# The cases each fold of a cross-validation validated on, predicted with their probabilities on
# the original grids: what find_best chooses the dataset's best configuration from.
rule validate_seg:
    input:
        data=seg_data_input,
        model=paths.MODEL,
        plan=of_run(G.plan_for_auto),
        previous=of_run(G.previous_inputs, False),
        ledger=ledgers(
            seg_data_input,
            paths.MODEL,
            of_run(G.plan_for_auto),
            of_run(G.previous_inputs, False),
        ),
    output:
        metrics=paths.VALIDATION_METRICS,
        probabilities=directory(f"{paths.VALIDATION}/probabilities"),
    params:
        data=of_run(G.run_location),
        read=of_dataset(G.read_options),
        launch=lambda wildcards: G.launch(wildcards.run).args(),
        out=of_run(G.run_dir, "validation"),
        overlap=run_evaluate("overlap"),
        mirror=mirror_option,
        previous=of_run(G.previous_args, False),
    log:
        "logs/validate_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/validate_seg/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(G.datasets_of("volumes")),
        run=one_of(G.fold_ids()),
    threads: lambda wildcards: G.launch(wildcards.run).threads
    resources:
        **RUN_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} --"
        " evaluate-seg --cases {params.data:q} --read {params.read:q} --model {input.model}"
        " --overlap {params.overlap} {params.mirror} --split val --probabilities {params.previous}"
        " --out {params.out}"


# nnU-Net's find_best_configuration: the best configuration or pair of a dataset from its folds'
# validation predictions, and the post-processing that raises their Dice.
rule find_best:
    input:
        validations=of_dataset(G.best_inputs),
        data=seg_data_input,
        ledger=ledgers(seg_data_input, of_dataset(G.best_inputs)),
    output:
        choice=paths.BEST_CHOICE,
        summary=report(
            f"{paths.BEST}/summary.md",
            caption="../report/best.rst",
            category="volumes",
            subcategory="{dataset}",
            labels={"figure": "best configuration"},
        ),
    params:
        data=of_dataset(G.best_location),
        configs=of_dataset(G.best_configs),
        out=of_dataset(G.best_folder),
    log:
        "logs/find_best/{dataset}.log",
    benchmark:
        "results/benchmarks/find_best/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(G.best_datasets()),
    threads: 1
    resources:
        **G.cpu_job(mem_mb=4000, runtime=60),
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} --"
        " find-best --cases {params.data:q} --configs {params.configs:q} --out {params.out}"

# Score each run on its dataset's held-out test split.


rule evaluate_jets:
    input:
        data=data_input(rules.index_jets.output[0]),
        model=rules.train_jets.output.model,
        plan=plan_for_auto,
        ledger=ledgers(
            data_input(rules.index_jets.output[0]), rules.train_jets.output.model, plan_for_auto
        ),
    output:
        metrics="results/{dataset}/runs/{run}/eval/metrics.json",
        predictions="results/{dataset}/runs/{run}/eval/predictions.h5",
        roc=report(
            "results/{dataset}/runs/{run}/eval/roc.png",
            caption="../report/roc_run.rst",
            category="jets",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "ROC"},
        ),
        confusion=report(
            "results/{dataset}/runs/{run}/eval/confusion.png",
            caption="../report/confusion.rst",
            category="jets",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "confusion matrix"},
        ),
    params:
        data=data_location,
        read=read_options,
        launch=launch_args,
        out=run_dir("eval"),
    log:
        "logs/evaluate_jets/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/evaluate_jets/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("jets")),
        run=one_of([r.run_id for r in runs_of("jets")]),
    # the experiment's processes and GPUs score the test split side by side
    threads: lambda wildcards: run_launch(wildcards).threads
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
        model=rules.train_seg.output.model,
        plan=plan_for_auto,
        previous=previous_inputs(test=True),
        ledger=ledgers(
            seg_data_input,
            rules.train_seg.output.model,
            plan_for_auto,
            previous_inputs(test=True),
        ),
    output:
        metrics="results/{dataset}/runs/{run}/eval/metrics.json",
        overlays=report(
            "results/{dataset}/runs/{run}/eval/overlays.png",
            caption="../report/overlays.rst",
            category="volumes",
            subcategory="{dataset}",
            labels={"run": "{run}", "figure": "overlays"},
        ),
    params:
        data=data_location,
        read=read_options,
        launch=launch_args,
        out=run_dir("eval"),
        overlap=lambda wildcards: run_evaluate(wildcards)["overlap"],
        mirror=lambda wildcards: "--mirror" if run_evaluate(wildcards)["mirror"] else "",
        previous=previous_args(test=True),
    log:
        "logs/evaluate_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/evaluate_seg/{dataset}/{run}.tsv"
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
        " evaluate-seg --cases {params.data:q} --read {params.read:q} --model {input.model}"
        " --overlap {params.overlap} {params.mirror} {params.previous} --out {params.out}"


# The cases each fold of a cross-validation validated on, predicted with their probabilities on
# the original grids: what find_best chooses the dataset's best configuration from.
rule validate_seg:
    input:
        data=seg_data_input,
        model=rules.train_seg.output.model,
        plan=plan_for_auto,
        previous=previous_inputs(test=False),
        ledger=ledgers(
            seg_data_input,
            rules.train_seg.output.model,
            plan_for_auto,
            previous_inputs(test=False),
        ),
    output:
        metrics="results/{dataset}/runs/{run}/validation/metrics.json",
        probabilities=directory("results/{dataset}/runs/{run}/validation/probabilities"),
    params:
        data=data_location,
        read=read_options,
        launch=launch_args,
        out=run_dir("validation"),
        overlap=lambda wildcards: run_evaluate(wildcards)["overlap"],
        mirror=lambda wildcards: "--mirror" if run_evaluate(wildcards)["mirror"] else "",
        previous=previous_args(test=False),
    log:
        "logs/validate_seg/{dataset}/{run}.log",
    benchmark:
        "results/benchmarks/validate_seg/{dataset}/{run}.tsv"
    wildcard_constraints:
        dataset=one_of(datasets_of("volumes")),
        run=one_of([r.run_id for r in fold_runs()]),
    threads: lambda wildcards: run_launch(wildcards).threads
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
        validations=best_inputs,
        data=seg_data_input,
        ledger=ledgers(seg_data_input, best_inputs),
    output:
        choice="results/{dataset}/best/choice.json",
        summary=report(
            "results/{dataset}/best/summary.md",
            caption="../report/best.rst",
            category="volumes",
            subcategory="{dataset}",
            labels={"figure": "best configuration"},
        ),
    params:
        data=data_location,
        configs=best_configs,
        out=lambda wildcards: f"results/{wildcards.dataset}/best",
    log:
        "logs/find_best/{dataset}.log",
    benchmark:
        "results/benchmarks/find_best/{dataset}.tsv"
    wildcard_constraints:
        dataset=one_of(sorted({r.dataset for r in fold_runs()})),
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
        **CPU_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} --"
        " find-best --cases {params.data:q} --configs {params.configs:q} --out {params.out}"

# Apply a trained model to new data (the config's `predict:` section): one job a chunk of the
# inputs, on the experiment's launch resources; the outputs of a chunk land in its folder.


rule predict:
    input:
        models=lambda wildcards: G.prediction_models(wildcards.name),
        choice=lambda wildcards: G.prediction_choice(wildcards.name),
        previous=lambda wildcards: G.prediction_previous(wildcards.name),
        ledger=ledgers(
            lambda wildcards: G.prediction_models(wildcards.name),
            lambda wildcards: G.prediction_previous(wildcards.name),
        ),
    output:
        directory(paths.PREDICTION),
    params:
        inputs=lambda wildcards: G.prediction_inputs(wildcards.name, wildcards.chunk),
        options=lambda wildcards: G.prediction_options(wildcards.name),
        launch=lambda wildcards: G.prediction_launch(wildcards.name).args(),
    log:
        "logs/predict/{name}/{chunk}.log",
    benchmark:
        "results/benchmarks/predict/{name}/{chunk}.tsv"
    wildcard_constraints:
        name=one_of(G.predictions),
        chunk=r"\d{4}",
    threads: lambda wildcards: G.prediction_launch(wildcards.name).threads
    resources:
        **PREDICT_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} -- predict --model {input.models}"
        " --input {params.inputs} --out {output} {params.options}"

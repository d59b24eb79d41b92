# Apply a trained model to new data (the config's `predict:` section): one job a chunk of the
# inputs, on the experiment's launch resources; the outputs of a chunk land in its folder.


rule predict:
    input:
        models=predict_models,
        choice=predict_choice,
        previous=predict_previous,
        ledger=ledgers(predict_models, predict_previous),
    output:
        directory("results/predict/{name}/part_{chunk}"),
    params:
        inputs=predict_inputs,
        options=predict_options,
        launch=lambda wildcards: predict_launch(wildcards).args(),
    log:
        "logs/predict/{name}/{chunk}.log",
    benchmark:
        "results/benchmarks/predict/{name}/{chunk}.tsv"
    wildcard_constraints:
        name=one_of(list(PREDICTIONS)),
        chunk=r"\d{4}",
    threads: lambda wildcards: predict_launch(wildcards).threads
    resources:
        **PREDICT_RESOURCES,
    conda:
        ENV
    shell:
        "voxjet job --log {log:q} --outputs {output:q} -- launch {params.launch} --threads {threads} -- predict --model {input.models}"
        " --input {params.inputs} --out {output} {params.options}"

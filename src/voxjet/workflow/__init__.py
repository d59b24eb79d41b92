"""The workflow layer: the run graph every Snakemake rule asks, tested without Snakemake."""

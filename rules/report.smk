# Stage 3: plots for the report (the HTML report itself is `snakemake --report report.html`).

PLOTS = ["step_time", "kernel_categories", "gpu_utilization", "nvtx_phases"]


rule plots:
    """PNG figures across runs, from the aggregated summary and per-run statistics."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        nvtx=expand(f"{RESULTS}/{{run}}/stats/nvtx_sum.csv", run=RUNS),
    output:
        [
            report(
                f"{RESULTS}/plots/{name}.png",
                caption=f"../report/plot_{name}.rst",
                category="Plots",
            )
            for name in PLOTS
        ],
    log:
        f"{LOGS}/plots.log",
    params:
        python=PYTHON,
        results=lambda wc, input: os.path.dirname(input.summary),
        outdir=lambda wc, output: os.path.dirname(output[0]),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis plots --summary {input.summary} --results {params.results}"
        " -o {params.outdir} > {log} 2>&1"

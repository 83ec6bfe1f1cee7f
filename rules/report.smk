# Stage 3: figures, findings and the overview for the report (the HTML report itself is
# `snakemake --report report.html`; its first result is the overview).

# Figures (analysis/outputs/figures.py): one file each, drawn from the summary and the
# per-run statistics with one shared vocabulary (analysis/outputs/style.py).
PLOTS = [
    "ladder_waterfall",
    "attention_sweep",
    "phase_gpu_time",
    "kernel_categories",
    "step_time",
    "top_kernels",
    "idle_time",
    "kernel_durations",
    "gpu_utilization",
]


rule plots:
    """PNG figures across runs, from the summary, the ladder tables and per-run statistics."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        plan=f"{RESULTS}/plan.json",
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
        ladders=expand(f"{RESULTS}/ladders/{{table}}.csv", table=LADDER_TABLES),
    output:
        [
            report(
                f"{RESULTS}/plots/{name}.png",
                caption=f"../report/plot_{name}.rst",
                category="2. Figures",
            )
            for name in PLOTS
        ],
    log:
        f"{LOGS}/plots.log",
    params:
        python=PYTHON,
        results=RESULTS,
        outdir=lambda wc, output: os.path.dirname(output[0]),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis plots --summary {input.summary} --results {params.results}"
        " -o {params.outdir} > {log} 2>&1"


rule findings:
    """Rules over the statistics: what to change, the evidence, and the fix's measured gain."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        plan=f"{RESULTS}/plan.json",
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
    output:
        report(
            f"{RESULTS}/findings.csv",
            caption="../report/findings.rst",
            category="1. Overview",
        ),
    log:
        f"{LOGS}/findings.log",
    params:
        python=PYTHON,
        results=RESULTS,
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis findings --results {params.results} -o {output} > {log} 2>&1"


rule overview:
    """The answer first: provenance, headline table, top findings, key figures."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        findings=f"{RESULTS}/findings.csv",
        plots=expand(f"{RESULTS}/plots/{{name}}.png", name=PLOTS),
        ladders=expand(f"{RESULTS}/ladders/{{table}}.csv", table=LADDER_TABLES),
    output:
        md=f"{RESULTS}/SUMMARY.md",
        html=report(
            f"{RESULTS}/overview.html",
            caption="../report/overview.rst",
            category="1. Overview",
        ),
    log:
        f"{LOGS}/overview.log",
    params:
        python=PYTHON,
        results=RESULTS,
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis overview --results {params.results} -o {output.md}"
        " --html {output.html} > {log} 2>&1"

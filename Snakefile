# profbench: profile attention and GPT workloads under Nsight Systems and report where the GPU
# time goes. Stages: rules/profile.smk -> rules/analyze.smk -> rules/report.smk; the container
# (rules/container.smk) is built first when running with --use-singularity; rules/common.smk
# holds the configuration and settings they share.
#
#   snakemake --cores 1 --use-singularity            # GPU default matrix (config.yaml)
#   snakemake --cores 2 --configfile tests/smoke.yaml # CPU smoke matrix
#   snakemake --report report.html                    # the publishable report

import os

from snakemake.utils import min_version

min_version("9.0")


# config.yaml is the default matrix; a --configfile replaces it rather than merging into it
# (merging would add the GPU runs to a CPU smoke matrix).
if not workflow.config_settings.configfiles:

    configfile: os.path.join(workflow.basedir, "config.yaml")


include: "rules/common.smk"


report: landing_page()


include: "rules/container.smk"
include: "rules/profile.smk"
include: "rules/distributed.smk"
include: "rules/analyze.smk"
include: "rules/report.smk"


rule all:
    input:
        f"{RESULTS}/summary.csv",
        expand(f"{RESULTS}/plots/{{name}}.png", name=PLOTS),
        expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
        expand(f"{RESULTS}/compare/{{name}}/speedup.csv", name=COMPARISONS),
        expand(f"{RESULTS}/compare/{{name}}/compare_categories.csv", name=PROFILED_COMPARISONS),
        expand(f"{RESULTS}/ladders/{{table}}.csv", table=LADDER_TABLES),
        f"{RESULTS}/findings.csv",
        f"{RESULTS}/SUMMARY.md",
        DIFF_OUTPUTS,
        DISTRIBUTED_OUTPUTS,
        TRACE_OUTPUTS,
    default_target: True

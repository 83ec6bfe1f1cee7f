# Stage 1: run each workload under `nsys profile` and export the capture to SQLite.


# The workloads wrap their measured steps in the NVTX range `profiled_region` and, on CUDA, in
# cudaProfilerStart/Stop; the warm-up steps come before both.
CAPTURE_ARGS = {
    "nvtx": "--capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop",
    "cudaProfilerApi": "--capture-range=cudaProfilerApi --capture-range-end=stop",
    "none": "",
}


rule install_nsys:
    """Nsight Systems from Debian's archive into the user cache, when no nsys is available."""
    output:
        str(NSYS_INSTALLED_MARKER),
    log:
        f"{LOGS}/install_nsys.log",
    run:
        # Runs on the host (never in the image, which has its own nsys).
        shell(f"{REPO}/scripts/install-nsys.sh {PROFBENCH_CACHE} > {log} 2>&1")


rule profile:
    """One run under nsys: warm-up outside the capture, measured steps inside it."""
    input:
        image=IMAGE_INPUT,
        nsys=NSYS_INPUT,
    output:
        sqlite=f"{RESULTS}/{{run}}/profile.sqlite",
        rep=f"{RESULTS}/{{run}}/profile.nsys-rep",
        times=f"{RESULTS}/{{run}}/times.json",
    log:
        f"{LOGS}/profile/{{run}}.log",
    params:
        workload=lambda wc: workload_args(wc.run),
        nsys=NSYS,
        python=PYTHON,
        trace=config["nsys"]["trace"],
        capture=CAPTURE_ARGS[config["nsys"]["capture"]],
        extra=config["nsys"]["extra_args"],
        prefix=lambda wc, output: output.sqlite.removesuffix(".sqlite"),
    container:
        RULE_CONTAINER
    shell:
        # The capture covers the measured steps only (see CAPTURE_ARGS). Non-registered NVTX
        # strings must count for the NVTX match. --stats=true prints nsys' own summary into
        # the log, kept next to our CSVs.
        "NSYS_NVTX_PROFILER_REGISTER_ONLY=0 {params.nsys} profile"
        " --trace={params.trace} --sample=none --cpuctxsw=none {params.capture}"
        " --stats=true --export=sqlite --force-overwrite=true {params.extra}"
        " -o {params.prefix}"
        " {params.python} -m workloads {params.workload} --out {output.times}"
        " > {log} 2>&1"

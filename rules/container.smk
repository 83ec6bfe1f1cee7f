# Stage 0: the profbench Apptainer image (containers/profbench.def), when running with
# --use-singularity. Settings and helpers live in rules/common.smk; see docs/containers.md.


# Builds only when the definition's hash or the build arguments have no cached image
# ($PROFBENCH_CACHE/images/profbench-<variant>-<key>.sif); otherwise it only links it.
# Runs on the host, also without --use-singularity (e.g. to prebuild the image):
#   snakemake --cores 1 resources/profbench-cuda.sif
# With container.build false the image at container.image is used as it is, never rebuilt.
if CONTAINER["build"]:

    rule build_container:
        input:
            definition=REPO / "containers/profbench.def",
            nsys_installer=REPO / "scripts/install-nsys.sh",
        output:
            CONTAINER_SIF,
        log:
            f"{LOGS}/build_container-{CONTAINER_VARIANT}.log",
        params:
            args=container_build_args(),
        localrule: True
        run:
            # `run:` keeps this on the host: the image cannot build itself.
            shell(f"{REPO}/scripts/build-container.sh {params.args} --link {output} > {log} 2>&1")

# profbench: the two quick-start commands, and the setup they share.
#   make run    profile the default (GPU) matrix in the container, then write the report
#   make test   the test suite (CPU is enough: real nsys, Snakemake, Apptainer, Chromium)

VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13.0 is what CI and the image pin; a GPU host may keep its own CUDA build
# (`make setup TORCH=` skips installing torch).
TORCH ?= torch==2.13.0
CORES ?= 1
SNAKEMAKE := $(VENV)/bin/snakemake

.PHONY: setup run smoke report test lint

setup: $(VENV)/.installed

# pip byte-compiles what it installs one file after another (about 80 s of the setup on 2
# cores); compileall then does it on every core at once, leaving out what no job or test
# imports: the libraries' own test suites and transformers' models other than the two the
# HuggingFace example builds (35% of the sources). Like pip, it leaves out the few files that
# do not compile (torch ships Python 3.12 test helpers), hence the ignored status.
NEVER_IMPORTED := /tests/|/transformers/models/(?!(auto|gpt2|llama)/)
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile $(if $(TORCH),'$(TORCH)') -e '.[dev]'
	$(PY) -m compileall -q -j 0 -x '$(NEVER_IMPORTED)' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null || true
	touch $@

# The checks first (standard library only): a machine without a GPU or apptainer is told at
# once, before the venv is set up or an image is built. CONTAINER=none runs the jobs in this
# host's Python environment instead of the image (a cluster module, a vendor container):
# scripts/run-on-host.sh, which needs no venv and no network (WHEEL_KIT for offline wheels);
# its --cores is 4 per GPU unless CORES is given, so analysis jobs overlap the GPU jobs.
# Both pass the host's GPU count as `--resources gpu=N` (whole GPUs: one job per GPU side by
# side, pipeline/gpus.py); in the image, --cores is one per GPU unless CORES is given.
CONTAINER ?= apptainer
# the config CONTAINER=none runs
CONFIG ?= config.yaml
run:
ifeq ($(CONTAINER),none)
	python3 -m pipeline.checks --gpu \
	  --why "make run CONTAINER=none profiles the GPU matrix ($(CONFIG)) in this Python environment"
	$(if $(filter command line,$(origin CORES)),CORES=$(CORES)) bash scripts/run-on-host.sh $(CONFIG)
else
	python3 -m pipeline.checks --gpu --apptainer \
	  --why "make run profiles the default GPU matrix (config.yaml) in the CUDA image"
	$(MAKE) setup
	gpus=$$($(PY) -m pipeline.gpus count) && \
	  $(SNAKEMAKE) --cores $(if $(filter command line,$(origin CORES)),$(CORES),$$gpus) \
	  --resources gpu=$$gpus --use-singularity
	$(SNAKEMAKE) --report results/report.html
endif

smoke: setup
	$(SNAKEMAKE) --cores 2 --configfile tests/smoke.yaml
	$(SNAKEMAKE) --configfile tests/smoke.yaml --report results/smoke/report.html

# Two pytest-xdist workers (CI has 2 cores), each test file whole on one of them: the smoke
# run starts on one, the Slurm cluster and then the image's run on the other, the rest follows
# (tests/conftest.py orders the files). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# The system tools (scripts/install-test-deps.sh: apt packages, Nsight Systems, Slurm) install
# while the venv is set up: the two share nothing and each waits mostly on downloads. The
# tools' messages follow pip's in one piece; the tests start only if both succeeded.
test:
	@echo "make test: the venv and the system tools (scripts/install-test-deps.sh) side by side"
	@log=$$(mktemp); scripts/install-test-deps.sh > "$$log" 2>&1 & tools=$$!; \
	$(MAKE) --no-print-directory setup; venv_status=$$?; \
	wait $$tools; tools_status=$$?; cat "$$log"; rm -f "$$log"; \
	if [ $$venv_status -ne 0 ] || [ $$tools_status -ne 0 ]; then \
	  echo "make test: setup failed (venv: exit $$venv_status," \
	       "scripts/install-test-deps.sh: exit $$tools_status)" >&2; exit 1; fi
	@# The project's own modules compiled once, here: where the environment sets
	@# PYTHONDONTWRITEBYTECODE (as many images do), every test process and pipeline job would
	@# otherwise compile the ones it imports again (0.3 s of each analysis job's start).
	$(PY) -m compileall -q -j 0 analysis pipeline workloads benchmarks > /dev/null
	$(PY) -m pytest -v --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(VENV)/bin/ruff check .
	$(SNAKEMAKE) --lint

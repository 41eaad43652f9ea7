# hpctrain — make install | test | run | bench | docs | lint | clean
#
# MPI=mpich (default) installs MPICH from PyPI (the `mpich` wheel) into .venv;
# MPI=system builds mpi4py against the MPI whose mpicc/mpiexec are on PATH.
# MPIEXEC_FLAGS adds launcher flags (e.g. --oversubscribe for Open MPI).

PYTHON ?= python3
VENV ?= .venv
MPI ?= mpich
NP ?= 4
MPIEXEC_FLAGS ?=
TEST_TIMEOUT ?= 900
TEST_WORKERS ?= 2

BIN := $(VENV)/bin
PY := $(BIN)/python
ifeq ($(MPI),system)
MPIEXEC ?= mpiexec
else
MPIEXEC ?= $(BIN)/mpiexec
endif
STAMP := $(VENV)/.installed-$(MPI)
REFERENCE_STAMP := $(VENV)/.installed-reference

DIGITS := inputs/digits.h5
UNIVERSE := runs/universe-32.h5
SHAPES := runs/shapes.h5

.PHONY: install test test-serial test-mpi test-slurm run digits resdigits images cosmoflow deepcam verify bench learning large-batch plots timeline docs lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(MPI),system)
	@command -v mpicc >/dev/null || { echo "MPI=system needs mpicc on PATH (e.g. apt-get install libmpich-dev)"; exit 1; }
	$(PY) -m pip install --quiet --no-binary mpi4py --no-cache-dir mpi4py
else
	$(PY) -m pip install --quiet mpich mpi4py
endif
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

test: test-serial test-mpi

# What the tests hold hpctrain against: PyTorch and torchvision (CPU use of the x86_64 wheels,
# about 5.5 GB in .venv) and onnxruntime. Every test that needs them runs: under
# HPCTRAIN_REQUIRE_REFERENCE=1 one that would skip fails instead, and each pytest run prints
# how many ran.
$(REFERENCE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,reference]'
	touch $@

# scikit-learn's handwritten digits in the HDF5 dataset format (the test extras install it)
$(DIGITS): $(STAMP)
	$(PY) -m hpctrain convert --digits --out $@

# 640 synthetic universes, 4 channels of 32^3, their 4 parameters as targets (80 MB)
$(UNIVERSE): $(STAMP)
	mkdir -p $(dir $@)
	$(PY) -m hpctrain convert --universe 640 --size 32 --seed 0 --out $@

# the examples in the docstrings (>>>) too; TEST_WORKERS pytest processes share the serial tests
# (most wait on the ranks they launch, so two keep a 2-core machine busy)
test-serial: install $(REFERENCE_STAMP) $(DIGITS)
	HPCTRAIN_REQUIRE_REFERENCE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) tests --ignore=tests/mpi
	$(PY) -m pytest -q --doctest-modules hpctrain

# The MPI suite on 1, 2, 3 and 4 ranks (odd counts catch uneven splits); -m mpi4py turns an
# uncaught exception into MPI_Abort, and the suite's conftest aborts on any failed test.
# --capture=sys leaves the file descriptors alone: a rank that aborts the job writes its line
# to them too, where capturing them would lose it with the process.
test-mpi: install $(REFERENCE_STAMP) $(DIGITS)
	set -e; for n in 1 2 3 4; do \
	  echo "== MPI tests on $$n ranks"; \
	  HPCTRAIN_REQUIRE_REFERENCE=1 timeout $(TEST_TIMEOUT) $(MPIEXEC) $(MPIEXEC_FLAGS) -n $$n \
	    $(PY) -m mpi4py -m pytest -q --capture=sys tests/mpi; \
	done

# The job scripts in jobs/ under a real Slurm: a cluster of two nodes on this machine (needs
# root; installs Debian's slurmctld, slurmd and munge when missing; leaves it up, and
# `bash jobs/local-cluster.sh down` stops it), tiny sbatch sweeps, a SIGUSR1 requeue,
# calibrate and verify across both nodes, and the HDF5 logs checked. About 1-3 minutes.
test-slurm: install
	VENV=$(VENV) bash tests/slurm/run.sh

# The main job: AlexNet on NP ranks, each layer's mode and grid chosen by the planner from the
# cost model and compute times measured here (cached for the next run). hpctrain sets the
# threads per rank itself.
run: install
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n $(NP) $(PY) -m hpctrain --net alexnet \
	  --grid auto --batch 16 --steps 20 --print-every 2

# Real data: the small CNN on the digits under a plan that mixes every mode, to >= 95 % held-out
# accuracy (the log has the accuracy curve in validation/accuracy).
digits: install $(DIGITS)
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net smallcnn --data $(DIGITS) \
	  --grid smallcnn-p4-mixed --batch 64 --epochs 15 --lr 0.1 \
	  --lr-schedule cosine --print-every 50 --log runs/digits.h5

# A residual net with batch norm on the digits under a mixed plan whose residual branches run
# on different grids (hpctrain/inputs/plans/resdigits-p4-mixed.plan).
resdigits: install $(DIGITS)
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net resdigits --data $(DIGITS) \
	  --grid resdigits-p4-mixed --batch 64 --epochs 4 --lr 0.1 \
	  --lr-schedule cosine --print-every 50 --log runs/resdigits.h5

# A folder of 1200 photographs of 4 shapes (JPEG and PNG, tests/shapes_folder.py) to a dataset
$(SHAPES): $(STAMP)
	$(PY) tests/shapes_folder.py runs/shapes --per-class 300
	$(PY) -m hpctrain convert --image-folder runs/shapes --size 32 --val-fraction 0.2 --out $@

# the shapes CNN on it with augmentation, its convolutions split by height, 4 ranks
images: install $(SHAPES)
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net shapes --data $(SHAPES) \
	  --grid conv=domain:2x2,fc=2x2 --augment standard --batch 32 --epochs 20 --lr 0.02 \
	  --lr-schedule cosine --print-every 100 --log runs/images.h5

# CosmoFlow on 32^3 universes under the auto plan (its first blocks split the depth), 4 ranks
cosmoflow: install $(UNIVERSE)
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net cosmoflow --image-size 32 \
	  --data $(UNIVERSE) --grid auto --batch 16 --epochs 8 --lr 0.05 --print-every 32 \
	  --log runs/cosmoflow.h5

# 96 synthetic climate-like samples, 16 fields of 64x64 with atmospheric rivers and tropical
# cyclones labelled per pixel (hpctrain/data/climate.py), 20% held out
CLIMATE := runs/climate-64.h5
$(CLIMATE): $(STAMP)
	$(PY) -m hpctrain convert --climate 96 --size 64 --out $@

# DeepCAM (MLPerf HPC's climate segmentation net, 56.5 M parameters) at 64x64 on them, 4 ranks
# under the auto plan (compute from FLOPs: nothing to time), its loss weighted per class as
# DeepCAM's (frequency^-0.125 of this set's classes); the held-out pixel accuracy and mean IoU
# after each epoch
deepcam: install $(CLIMATE)
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net deepcam --image-size 64 \
	  --data $(CLIMATE) --grid auto --compute flops --batch 8 --epochs 3 --lr 0.01 \
	  --class-weights 1,1.33,1.88 --print-every 3 --eval-every 9 --log runs/deepcam.h5

verify: install
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n $(NP) $(PY) -m hpctrain verify --net alexnet \
	  --grid conv=domain:2x2,fc=4x1 --batch 4

# The planner's targets: plans at P = 4096 in well under a second; then, on NP ranks, a fresh
# calibration and every plan trained a few steps, predicted against measured; freed memory kept
# against glibc's own malloc (bench/freed_memory.py); then AlexNet
# throughput against PyTorch and DDP (bench/throughput.py; table in runs/bench/throughput.txt),
# and ResNet-18 with batch norm per rank against DDP, measured and predicted; torchvision's
# models through ONNX, predicted on 2 ranks against onnxruntime (bench/interchange.py);
# MobileNet v2 against PyTorch, and its depthwise layers alone (bench/depthwise.py).
BENCH_NET ?= alexnet
BENCH_IMAGE ?= 127
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(REFERENCE_STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench: install $(BENCH_STAMP)
	$(PY) bench/planning.py --repeat 5
	$(PY) bench/moves.py
	$(PY) bench/input_splits.py
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n $(NP) $(PY) -m hpctrain calibrate
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n $(NP) $(PY) -m hpctrain compare-plans --net $(BENCH_NET) \
	  --image-size $(BENCH_IMAGE) --batch 16 --steps 8 --log runs/compare-$(BENCH_NET).h5
	$(PY) bench/predictions.py --procs 2
	$(PY) bench/freed_memory.py --procs 2 --launches 2
	$(PY) bench/throughput.py --procs 1 2 4 --batch 16 --image-size $(BENCH_IMAGE) --steps 6
	$(PY) bench/throughput.py --net resnet18 --procs 1 2 --rounds 3
	$(PY) bench/throughput.py --net cosmoflow --procs 1 2 --rounds 3
	$(PY) bench/throughput.py --net mobilenet_v2 --procs 1 2 --rounds 3
	$(PY) bench/depthwise.py --repeat 5
	$(PY) bench/depthwise.py --orders --repeat 5 --out runs/bench/depthwise-orders.txt
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 2 $(PY) -m hpctrain compare-plans --net resnet18 \
	  --image-size 32 --batch 16 --steps 8 --rounds 3 --threads 1 --bn-group rank \
	  --log runs/compare-resnet18-rank.h5
	$(PY) bench/threads.py --procs 2 --net $(BENCH_NET) --image-size $(BENCH_IMAGE) --batch 16
	$(PY) bench/memory.py --procs 2 --steps 3
	$(PY) bench/conv3d.py --repeat 7
	$(PY) bench/prefetch.py --procs 2 --steps 12
	$(PY) bench/interchange.py --procs 2 --rounds 3

# Learning alike: hpctrain on 2 ranks and the same recipe in PyTorch, 16 seeds each, on a folder
# of three shapes; held-out accuracy per side and the gap with its standard error
# (bench/learning.py; minutes, so neither in test nor in bench)
learning: install $(BENCH_STAMP)
	$(PY) bench/learning.py

# LARS at batch 256 beside SGD at 16 and at 256 with a linearly scaled rate, 8 seeds on 2 ranks
# (bench/large_batch.py; minutes, so neither in test nor in bench)
large-batch: install $(BENCH_STAMP)
	$(PY) bench/large_batch.py

# Plots. First the paper's study from the cost model for each of SIM_NETS (no MPI, seconds
# each): runs/simulation/NET.h5 and its figures in PLOTS/simulation/NET/ (per study: grids,
# speedup, and the auto plan against pure batch and one weird trick). Then, when LOGS matches
# any file, the HDF5 run logs: strong/weak scaling, per-layer compute/communication/
# redistribution, predicted against measured, training curves. Reads files only (no MPI).
# Other hpctrain files in LOGS (runs/simulation.h5) are skipped with a note.
SIM_NETS ?= resnet50 inception_v3
LOGS ?= runs/*.h5
PLOTS ?= plots
TIMELINE_LOG ?= runs/timeline/alexnet-p4.h5
plots: install
	set -e; for net in $(SIM_NETS); do \
	  $(PY) -m hpctrain simulate --net $$net --out runs/simulation/$$net.h5 \
	    --plots $(PLOTS)/simulation/$$net; \
	done
	$(PY) -m hpctrain simulate --volumes --out runs/volumes.h5 --plots $(PLOTS)/volumes
	$(MAKE) --no-print-directory timeline
ifneq ($(wildcard $(LOGS)),)
	$(PY) analysis/plot_logs.py $(LOGS) --out $(PLOTS)
else
	@echo "no file matches LOGS=$(LOGS): run-log plots skipped (write a log with --log run.h5)"
endif

# The timeline of two steps of AlexNet on 4 ranks (convolutions batch-parallel, the classifier
# model-parallel) with the gradient sums in flight: every rank's compute, communication,
# redistribution and sums in flight, as a PNG and a Chrome trace (open it in ui.perfetto.dev).
# A new log each time: an earlier one is renamed aside.
timeline: install
	$(MPIEXEC) $(MPIEXEC_FLAGS) -n 4 $(PY) -m hpctrain --net alexnet --image-size 127 \
	  --batch 16 --grid conv=1x4,fc=4x1 --steps 3 --overlap --timeline 2:3 \
	  --log $(TIMELINE_LOG) --print-every 1
	$(PY) analysis/timeline.py $(TIMELINE_LOG) --out $(PLOTS)/timeline

# The documentation site: docs/*.md and the API reference generated from the docstrings, as HTML
# in build/docs/ (open build/docs/index.html). Every warning is an error and every
# cross-reference is checked; then the pages' examples, paths and links (tests/test_docs.py).
docs: install
	$(PY) -m sphinx -b html -n -W --keep-going -q docs build/docs
	$(PY) -m pytest -q tests/test_docs.py

lint: install
	$(BIN)/ruff check hpctrain tests analysis bench

clean:
	rm -rf $(VENV) build docs/reference/generated *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

#!/usr/bin/env bash
# hpctrain against PyTorch on one GPU, for a lent GPU machine with no internet: installs what it
# lacks from the wheels in .whl/ (the cuDNN Frontend; an MPI library, cuda-bindings and pytest only
# where missing), prints the versions, runs the GPU tests of the cuDNN convolutions against
# im2col, then bench/gpu_step.py, then two ranks on one GPU (the transport --collectives auto
# picks for them, NCCL or MPI, against MPI). Everything lands under $OUT (default
# runs/bench/gpu); the tables go to stdout as each number is measured. Under 5 minutes on an
# H100 as it stands.
#
#   OUT=/some/dir bash bench/gpu_device.sh                      # everything
#   bash bench/gpu_device.sh --nets resnet50 --precisions bf16  # arguments go to gpu_step.py
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/bench/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SECONDS=0
BENCH_UNTIL=${BENCH_UNTIL:-290}  # seconds from the start by which the benchmark is cut

# install_wheels TARGET WHEEL...: pip where it works, else each wheel unzipped as it is and
# its modules imported (bench/wheels.py), failing loudly where one does not
install_wheels() {
    local target=$1; shift
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$target" "$@" 2>/dev/null \
        && return 0
    echo "pip could not install $*; unzipping them into $target"
    # without pip's checks of platform and dependencies: each wheel's modules must import
    $PY bench/wheels.py "$target" "$@" || { echo "ERROR: the wheels above do not import here"; return 1; }
}
if install_wheels /tmp/site .whl/*.whl; then
    export PYTHONPATH=/tmp/site:$PWD
else
    echo "wheels not installed"; export PYTHONPATH=$PWD
fi
# the frontend plans through cuda-bindings; install it only where the machine has none
if ! $PY -c "import cuda.bindings.driver" 2>/dev/null && ls .whl/extra/*.whl >/dev/null 2>&1; then
    install_wheels /tmp/site-extra .whl/extra/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-extra
fi
if ! $PY -c "import pytest" 2>/dev/null && ls .whl/test/*.whl >/dev/null 2>&1; then
    install_wheels /tmp/site-test .whl/test/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-test
fi
# libcudnn.so.9 from PyTorch's wheels, where the dynamic linker would not find it
CUDNN_LIB=$($PY - <<'EOF'
import glob, os, sys
for root in sys.path:
    for found in glob.glob(os.path.join(root or ".", "nvidia", "**", "libcudnn.so.9"), recursive=True):
        print(os.path.dirname(os.path.abspath(found)))
        raise SystemExit
EOF
)
[ -n "$CUDNN_LIB" ] && export LD_LIBRARY_PATH=$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

mpi_version() { $PY -c "from mpi4py import MPI; print('MPI:', MPI.Get_library_version().splitlines()[0])"; }
if ! mpi_version 2>/dev/null; then
    # the mpich wheel's libraries, unpacked as they are (pip --target leaves its lib/ out)
    rm -rf /tmp/mpich && $PY -m zipfile -e .whl/mpich-*.whl /tmp/mpich >/dev/null 2>&1
    MPICH=$(ls -d /tmp/mpich/mpich-*.data/data 2>/dev/null | head -n 1)
    if [ -n "$MPICH" ]; then
        chmod +x "$MPICH"/bin/* 2>/dev/null
        export LD_LIBRARY_PATH=$MPICH/lib:${LD_LIBRARY_PATH:-} PATH=$MPICH/bin:$PATH
    fi
    mpi_version || echo "MPI: none found; hpctrain cannot run (mpi4py needs an MPI library)"
fi

$PY - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import importlib
def show(what, get):
    try:
        print(f"{what}: {get()}")
    except Exception as err:
        print(f"{what}: unavailable ({type(err).__name__}: {err})")
def torch_words():
    torch = importlib.import_module("torch")
    return (f"{torch.__version__} cuda {torch.version.cuda} cudnn "
            f"{torch.backends.cudnn.version()} on {torch.cuda.get_device_name()}")
show("torch", torch_words)
show("cupy", lambda: importlib.import_module("cupy").__version__)
show("nccl (cupy)", lambda: importlib.import_module("cupy.cuda.nccl").get_version())
show("cudnn frontend", lambda: importlib.import_module("cudnn").__version__)
from hpctrain.kernels import cudnn_conv
show("cudnn backend", lambda: cudnn_conv.unavailable() or importlib.import_module("cudnn").backend_version())
EOF

echo "== cuDNN convolutions against im2col, fused batch norm and SGD against the generic kernels"
timeout 150 $PY -m pytest -q -p no:cacheprovider -rfEsx --tb=line tests/test_cudnn_conv.py \
    tests/test_fused_norm.py tests/test_fused_sgd.py > "$OUT/test_cudnn_conv.txt" 2>&1
echo "pytest exit status $? after ${SECONDS}s"
tail -n 25 "$OUT/test_cudnn_conv.txt"

echo "== training step, hpctrain against PyTorch (bench/gpu_step.py)"
timeout $((BENCH_UNTIL - SECONDS > 60 ? BENCH_UNTIL - SECONDS : 60)) $PY bench/gpu_step.py \
    --out "$OUT/gpu_step.json" "$@" 2>&1 | tee "$OUT/gpu_step.txt"
echo "gpu_step exit status ${PIPESTATUS[0]} after ${SECONDS}s; files in $OUT"

# two ranks sharing one GPU: --collectives auto against the host-staged MPI step, the same
# losses. NCCL before 2.30.3 refuses ranks that share a device, and 2.30.3 and later run them
# with NCCL_MULTI_RANK_GPU_ENABLE=1: auto makes that choice, as in training, and says which
MPIEXEC=$(command -v mpiexec || ls /tmp/site/bin/mpiexec /tmp/mpich/mpich-*.data/data/bin/mpiexec \
          2>/dev/null | head -n 1)
if [ -n "${MPIEXEC:-}" ] && [ "${NCCL_CHECK:-1}" = 1 ]; then
    ONE_GPU=${CUDA_VISIBLE_DEVICES:-0}; ONE_GPU=${ONE_GPU%%,*}  # both ranks on the first GPU
    echo "== 2 ranks on GPU $ONE_GPU (NCCL_MULTI_RANK_GPU_ENABLE=1): auto against mpi ($MPIEXEC)"
    for how in auto mpi; do
        timeout 90 "$MPIEXEC" -n 2 env NCCL_MULTI_RANK_GPU_ENABLE=1 CUDA_VISIBLE_DEVICES=$ONE_GPU \
            $PY -m hpctrain --device gpu \
            --net resnet18 --image-size 64 --batch 32 --steps 8 --print-every 1 --compute flops \
            --precision ${NCCL_PRECISION:-bf16} --grid ${NCCL_GRID:-conv=domain:2x1,fc=2x1} \
            --collectives $how 2>&1 | grep -E "^collectives|^step|^done|rror|NCCL" | head -n 15 \
            > "$OUT/ranks2_$how.txt"
        # auto names its choice where ranks share a GPU; without NCCL in CuPy it is mpi
        ran=$(sed -n 's/^collectives: \([a-z]*\).*/\1/p' "$OUT/ranks2_$how.txt" | head -n 1)
        [ "$how" = mpi ] && ran=mpi
        echo "--collectives $how ran ${ran:-mpi (CuPy has no NCCL)}" >> "$OUT/ranks2_$how.txt"
        cat "$OUT/ranks2_$how.txt"
    done
fi
echo "all done after ${SECONDS}s"

#!/usr/bin/env bash
# Runs on the GPU (device) machine, from the repository root, in one call: unpacks the bundle that
# scripts/device_bundle.sh made here (binaries + the libraries the device lacks), then
#   tests: the GPU op tests (tests/gpu/*_test.cc binaries), tests/gpu/test_gpu_train.py,
#          tests/gpu/test_gpu_offload.py, tests/gpu/test_gpu_llama.py (the Llama family
#          against transformers) and tests/gpu/test_gpu_fp8.py (needs the bundle made with
#          --quickstart-data)
#   bench: bench/gpu/bench_train.py, ours next to the PyTorch peer
#   tutorial: bench/gpu/tutorial_tables.py, the Megatron tutorial's rows that fit the GPUs present
#          beside Megatron's figures ($OUT/tutorial.md, each row's log in $OUT/tutorial_logs)
# and leaves logs in $OUT (the device tool's output folder) or /tmp/leantron-out.
#   here:   bash scripts/device_bundle.sh
#   device: bash scripts/device_check.sh [tests|pytest|multi|parallel|bench|compare|tutorial|
#           megatron-fixtures|megatron-resume|all] [args...]
#   compare: bench/gpu/compare_builds.py between this bundle and .bundle/base.tar.gz (another build
#   packed by scripts/device_bundle.sh --name base), loss curves bit for bit and step times
#   megatron-fixtures [--gpus N] [--only NAMES]: testdata/megatron/make_fixtures.sh (real Megatron-LM
#   from .cache/megatron-lm, made here by testdata/megatron/prepare_megatron.sh)
#   megatron-resume: testdata/megatron/resume_check.sh (Megatron resumes from our checkpoints)
set -uo pipefail
what="${1:-all}"
shift || true
OUT="${OUT:-/tmp/leantron-out}"
mkdir -p "$OUT" /tmp/lt
tar -xzf "${LEANTRON_BUNDLE:-.bundle/leantron.tar.gz}" -C /tmp/lt || exit 1
export PATH=/tmp/lt/bin:$PATH LD_LIBRARY_PATH=/tmp/lt/lib LEANTRON_BIN=/tmp/lt/bin
export LEANTRON_ROOT="$PWD" PYTHONUNBUFFERED=1
# Python packages the bundle carries (device_bundle.sh --torchao), beside the machine's own.
if ls /tmp/lt/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --target /tmp/lt/py /tmp/lt/wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/lt/py${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
GPUS=$(nvidia-smi -L | grep -c '^GPU')
status=0
# A skipped test exits 0: each log is also checked for skips the machine at hand should not have
# (anything but "needs N GPUs" with N above $GPUS), so a run where tests skipped cannot look green.
skips() { python3 scripts/check_skips.py --gpus "$GPUS" "$@" || status=1; }
if [[ "$what" == tests || "$what" == all ]]; then
  for t in /tmp/lt/bin/gpu_*; do
    echo "== $(basename "$t")"
    "$t" >"$OUT/$(basename "$t").log" 2>&1 || status=1
    tail -n 25 "$OUT/$(basename "$t").log"
    skips "$OUT/$(basename "$t").log"
  done
fi
if [[ "$what" == tests || "$what" == all || "$what" == pytest ]]; then
  echo "== tests/gpu/test_gpu_train.py tests/gpu/test_gpu_offload.py tests/gpu/test_gpu_llama.py tests/gpu/test_gpu_fp8.py"
  # The quickstart corpus, preprocessed here (scripts/device_bundle.sh --quickstart-data).
  export LEANTRON_QUICKSTART_DATA=/tmp/lt/data/quickstart/english_text_document
  python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_train.py \
    tests/gpu/test_gpu_offload.py tests/gpu/test_gpu_llama.py tests/gpu/test_gpu_fp8.py -s \
    ${PYTEST_K:+-k "$PYTEST_K"} \
    >"$OUT/pytest_gpu.log" 2>&1 || status=1
  tail -n 40 "$OUT/pytest_gpu.log"
  skips "$OUT/pytest_gpu.log"
fi
if [[ "$what" == multi ]]; then  # two or more GPUs (nvidia-h200-x2)
  echo "== gpu_nccl_test"
  /tmp/lt/bin/gpu_nccl_test >"$OUT/gpu_nccl_test.log" 2>&1 || status=1
  tail -n 25 "$OUT/gpu_nccl_test.log"
  skips "$OUT/gpu_nccl_test.log"
  echo "== tests/gpu/test_multi_gpu.py"
  python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_multi_gpu.py -s ${PYTEST_K:+-k "$PYTEST_K"} \
    >"$OUT/pytest_multi.log" 2>&1 || status=1
  tail -n 60 "$OUT/pytest_multi.log"
  skips "$OUT/pytest_multi.log"
fi
if [[ "$what" == parallel ]]; then  # the tutorial's table on two GPUs
  echo "== bench/gpu/bench_parallel.py $*"
  python3 bench/gpu/bench_parallel.py --bin /tmp/lt/bin --out "$OUT/parallel.md" "$@" || status=1
fi
if [[ "$what" == tutorial ]]; then  # e.g. tutorial --table dp --iters 50
  echo "== bench/gpu/tutorial_tables.py $*"
  python3 bench/gpu/tutorial_tables.py --bin /tmp/lt/bin --out "$OUT/tutorial.md" \
    --log-dir "$OUT/tutorial_logs" "$@" || status=1
fi
if [[ "$what" == compare ]]; then
  mkdir -p /tmp/base && tar -xzf .bundle/base.tar.gz -C /tmp/base || exit 1
  echo "== bench/gpu/compare_builds.py $*"
  python3 bench/gpu/compare_builds.py --base /tmp/base/bin --new /tmp/lt/bin "$@" || status=1
fi
if [[ "$what" == megatron-fixtures ]]; then
  echo "== testdata/megatron/make_fixtures.sh $*"
  bash testdata/megatron/make_fixtures.sh "$@" || status=1
fi
if [[ "$what" == megatron-resume ]]; then
  echo "== testdata/megatron/resume_check.sh"
  bash testdata/megatron/resume_check.sh || status=1
fi
if [[ "$what" == bench || "$what" == all ]]; then
  echo "== bench/gpu/bench_train.py $*"
  python3 bench/gpu/bench_train.py --bin /tmp/lt/bin --out "$OUT/bench.md" "$@" || status=1
fi
exit $status

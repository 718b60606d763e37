"""scripts/check_skips.py, which scripts/device_check.sh runs on the GPU machine: a skip passes
only when the test needs more GPUs than the machine has. Logs as GoogleTest 1.12 and pytest -rs
write them."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GTEST = """[ RUN      ] NcclComm.DeadRankStopsTheOthers
tests/gpu/nccl_comm_test.cc:703: Skipped
needs 2 GPUs, found 1
[  SKIPPED ] NcclComm.DeadRankStopsTheOthers (0 ms)
[ RUN      ] NcclComm.Works
[       OK ] NcclComm.Works (3 ms)
"""
GTEST_NO_DEVICE = """[ RUN      ] CudaOps.Matmul
tests/gpu/cuda_ops_test.cc:184: Skipped
no CUDA device
[  SKIPPED ] CudaOps.Matmul (0 ms)
"""
PYTEST = """........s
=========================== short test summary info ============================
SKIPPED [4] tests/gpu/test_multi_gpu.py:31: needs two GPUs
"""
PYTEST_MISSING = """....s
SKIPPED [1] tests/gpu/test_gpu_train.py:111: could not import 'torch': No module named 'torch'
"""


@pytest.mark.parametrize("log,gpus,ok", [
    (GTEST, 1, True), (GTEST, 2, False), (GTEST_NO_DEVICE, 1, False), (PYTEST, 1, True),
    (PYTEST, 2, False), (PYTEST_MISSING, 8, False), ("[  PASSED  ] 3 tests.\n", 1, True)])
def test_only_skips_for_missing_gpus_pass(tmp_path, log, gpus, ok):
    (tmp_path / "run.log").write_text(log)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_skips.py"), "--gpus",
                           str(gpus), str(tmp_path / "run.log")], capture_output=True, text=True)
    assert proc.returncode == (0 if ok else 1), proc.stdout + proc.stderr
    if log.count("SKIPPED") or "Skipped" in log:
        assert "skip: " in proc.stdout

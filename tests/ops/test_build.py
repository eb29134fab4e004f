"""Build checks: the CUDA kernels compile wherever a CUDA compiler exists (even without a GPU), the
module links the CUDA runtime statically, and it imports on a machine without a driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11
import pytest

ROOT = Path(__file__).resolve().parents[2]


def find_nvcc() -> str | None:
    candidates = [shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


NVCC = find_nvcc()


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="no CUDA compiler (nvcc) on this machine")
def test_cuda_kernels_compile_link_statically_and_import(tmp_path):
    configure = subprocess.run(
        [
            "cmake", "-S", str(ROOT), "-B", str(tmp_path), *(["-G", "Ninja"] if shutil.which("ninja") else []),
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release", "-DORSD_ENABLE_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={NVCC}",
            "-DORSD_CUDA_ARCHS=80;90",
        ],
        capture_output=True, text=True,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stdout + configure.stderr
    assert "orsd: compiled backends: cpu" in configure.stdout
    assert "cuda (nvcc" in configure.stdout and "archs 80;90" in configure.stdout, configure.stdout

    build = subprocess.run(["cmake", "--build", str(tmp_path)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    (module,) = tmp_path.glob("_C*.so")

    if shutil.which("readelf"):
        needed = subprocess.run(
            ["readelf", "-d", str(module)], capture_output=True, text=True, check=True
        ).stdout
        assert "libcudart" not in needed, needed  # static runtime: import never needs libcudart

    probe = subprocess.run(
        [sys.executable, "-c", "import _C; print(_C.cuda_compiled(), _C.cuda_archs(), *_C.cuda_probe()[:2])"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    compiled, archs, count, code = probe.stdout.split()[:4]
    assert compiled == "True" and archs == "80,90"
    assert int(count) >= 0 and (int(count) > 0 or int(code) != 0)

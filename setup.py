"""Builds the native extension `orsd._C` by driving CMake (pybind/cmake_example style).

Everything else (metadata, dependencies, packages) lives in pyproject.toml. Environment switches:
  ORSD_DISABLE_CUDA=1        build the CPU kernels only, even when nvcc is found
  ORSD_CUDA_ARCHS="80;90"    CUDA architectures (CMAKE_CUDA_ARCHITECTURES), default 80;90
  CMAKE_ARGS="..."           extra arguments for the CMake configure step
  CMAKE_BUILD_PARALLEL_LEVEL parallel compile jobs (default: setuptools' --parallel, else CMake's)
  ORSD_BUILD_TYPE=Debug      CMake build type (default Release)
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    """An extension whose sources are built by the CMake project at `sourcedir`."""

    def __init__(self, name: str, sourcedir: Path = ROOT) -> None:
        super().__init__(name, sources=[])
        self.sourcedir = os.fspath(Path(sourcedir).resolve())


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "on", "true", "yes"}


def _find_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError(
            "orsd needs CMake >= 3.18 to build its native extension, and none was found on PATH; "
            "install it (e.g. `apt-get install cmake` or `pip install cmake`)"
        )
    return cmake


def _find_ninja() -> str | None:
    try:
        import ninja  # the `ninja` wheel from the build requirements

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.exists():
            return os.fspath(path)
    except ImportError:
        pass
    return shutil.which("ninja")


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            super().build_extension(ext)
            return
        import pybind11

        ext_path = Path(self.get_ext_fullpath(ext.name)).resolve()
        ext_dir = ext_path.parent
        build_type = os.environ.get("ORSD_BUILD_TYPE", "Debug" if self.debug else "Release")
        cmake_args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={ext_dir}{os.sep}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DORSD_ENABLE_CUDA={'OFF' if _truthy(os.environ.get('ORSD_DISABLE_CUDA')) else 'ON'}",
        ]
        if os.environ.get("ORSD_CUDA_ARCHS"):
            cmake_args.append(f"-DORSD_CUDA_ARCHS={os.environ['ORSD_CUDA_ARCHS']}")
        cmake_args += shlex.split(os.environ.get("CMAKE_ARGS", ""))

        ninja = _find_ninja()
        if ninja is not None and not any(a.startswith("-G") for a in cmake_args):
            cmake_args += ["-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]

        build_args = ["--config", build_type]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ and getattr(self, "parallel", None):
            build_args += ["--parallel", str(self.parallel)]

        build_temp = Path(self.build_temp) / ext.name
        build_temp.mkdir(parents=True, exist_ok=True)
        cmake = _find_cmake()
        subprocess.run([cmake, ext.sourcedir, *cmake_args], cwd=build_temp, check=True)
        subprocess.run([cmake, "--build", ".", *build_args], cwd=build_temp, check=True)


setup(ext_modules=[CMakeExtension("orsd._C")], cmdclass={"build_ext": CMakeBuild})

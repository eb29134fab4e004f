"""The BLAS GEMMs the ops call directly, found through ctypes inside the torch already loaded
(the native module links no BLAS of its own): on CPU MKL's cblas_gemm_bf16bf16f32 /
cblas_gemm_f16f16f32 (bf16/f16 in, f32 out) and Fortran sgemm_, exported by libtorch_cpu; on CUDA
cuBLAS's cublasGemmEx from the libcublas torch has loaded. Each is looked up once and checked on a
small product against torch; a lookup gives None when the symbol is absent or wrong, and the
caller takes its own path instead (torch, or the native kernels' own GEMM).
"""

from __future__ import annotations

import ctypes
import os

import torch

CBLAS_INT_MAX = 2**31 - 1
"""MKL's CBLAS (LP64) takes sizes as C int; ctypes would silently wrap anything larger."""


# ---- CPU, 16-bit in: out = a @ b.T (f32) with a [m, k], b [n, k] -------------------------------
# Low-precision inputs must not be rounded back to bf16/f16 at the output (the contract is f32
# logits from the given values), so the GEMM needs an f32 output.

_mkl_cache: dict[torch.dtype, object] = {}


def mkl_gemm(dtype: torch.dtype):
    """MKL's cblas_gemm_{bf16bf16,f16f16}f32 as exported by the libtorch_cpu that torch already
    loaded (bf16/f16 in, f32 out, AVX512-BF16/AMX where present); None when this torch build has
    no such symbol or it fails a small self-test."""
    if dtype in _mkl_cache:
        return _mkl_cache[dtype]
    function = None
    symbol = {torch.bfloat16: "cblas_gemm_bf16bf16f32", torch.float16: "cblas_gemm_f16f16f32"}.get(dtype)
    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        function = getattr(library, symbol)
        function.restype = None
        function.argtypes = [ctypes.c_int] * 6 + [
            ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
            ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
        ]  # fmt: skip
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(3, 37, generator=generator).to(dtype)
        b = torch.randn(5, 37, generator=generator).to(dtype)
        got = torch.empty(3, 5)
        call_mkl(function, a, b, got)
        with torch.autocast("cpu", enabled=False):  # an f32 check even when called under bf16 autocast
            expected = a.float() @ b.float().T
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
            function = None
    except (OSError, AttributeError, TypeError):
        function = None
    _mkl_cache[dtype] = function
    return function


def call_mkl(function, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b.T through `function`, a mkl_gemm (benchmarks/flops.py counts the replay's 16-bit
    head GEMMs by wrapping this)."""
    row_major, no_trans, trans = 101, 111, 112  # CBLAS enums
    m, k = a.shape
    n = b.shape[0]
    function(
        row_major, no_trans, trans, m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), k, 0.0, out.data_ptr(), n
    )


# ---- CPU: the address the native kernels call ----------------------------------------------

_gemm_cache: dict[torch.dtype, int | None] = {}


def cpu_gemm(dtype: torch.dtype) -> int | None:
    """Address of the f32-output GEMM for `dtype` that the CPU kernels call (None when missing):
    MKL's cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32 (mkl_gemm) or the Fortran sgemm_ for f32,
    all exported by libtorch_cpu."""
    if dtype not in _gemm_cache:
        # The self-tests compare with torch matmuls, which must run in f32 even when the first call
        # comes from inside a bf16 autocast region (the update's forward).
        with torch.autocast("cpu", enabled=False):
            if dtype == torch.float32:
                function = sgemm()
            else:
                function = mkl_gemm(dtype)
        _gemm_cache[dtype] = None if function is None else ctypes.cast(function, ctypes.c_void_p).value
    return _gemm_cache[dtype]


def sgemm():
    """MKL's Fortran sgemm_ from libtorch_cpu, or None when absent or wrong on a small self-test."""
    int_p, float_p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float)
    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        function = library.sgemm_
    except (OSError, AttributeError):
        return None
    function.restype = None
    function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, int_p, int_p, int_p, float_p, ctypes.c_void_p, int_p,
                         ctypes.c_void_p, int_p, float_p, ctypes.c_void_p, int_p]  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 37, generator=generator), torch.randn(5, 37, generator=generator)
    got = torch.empty(3, 5)
    # Row-major a @ b.T is column-major (b a^T): M = 5, N = 3, K = 37, A = b ('T'), B = a ('N').
    size = lambda n: ctypes.byref(ctypes.c_int(n))  # noqa: E731
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    function(b"T", b"N", size(5), size(3), size(37), ctypes.byref(one), b.data_ptr(), size(37),
             a.data_ptr(), size(37), ctypes.byref(zero), got.data_ptr(), size(5))  # fmt: skip
    return function if torch.allclose(got, a @ b.T, rtol=1e-5, atol=1e-5) else None


# ---- CUDA: cuBLAS inside the torch already loaded ---------------------------------------------


def find_cublas() -> int | None:
    """cublasGemmEx from the libcublas torch has loaded (found in /proc/self/maps once torch has
    made its handle), checked on a small bf16 and f32 product against torch; None when absent."""
    if not torch.cuda.is_available():
        return None
    generator = torch.Generator(device="cuda").manual_seed(0)
    operands = [(torch.randn(37, 67, generator=generator, device="cuda").to(dtype),
                 torch.randn(53, 67, generator=generator, device="cuda").to(dtype), type_code, compute)
                for dtype, type_code, compute in ((torch.bfloat16, 14, 68), (torch.float32, 0, 69))]  # fmt: skip
    # after the first allocation, so that the CUDA context is current when cuBLAS starts
    handle = torch.cuda.current_blas_handle()  # loads cuBLAS and binds the current stream
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcublas.so" in line and "libcublasLt" not in line}
        function = ctypes.CDLL(sorted(paths)[0]).cublasGemmEx if paths else None
    except (OSError, AttributeError):
        return None
    if function is None:
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, *[ctypes.c_int] * 5, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # fmt: skip
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    for a, b, type_code, compute in operands:
        got = torch.empty(37, 53, device="cuda")
        # row-major got = a @ b.T is column-major got^T [53, 37] = b (op T on col-major [67, 53]) . a
        status = function(handle, 1, 0, 53, 37, 67, ctypes.byref(one), b.data_ptr(), type_code, 67,
                          a.data_ptr(), type_code, 67, ctypes.byref(zero), got.data_ptr(), 0, 53, compute, -1)  # fmt: skip
        want = a.double() @ b.double().T
        if status != 0 or not torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4):
            return None
    return ctypes.cast(function, ctypes.c_void_p).value

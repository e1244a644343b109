"""The external CUDA tools: ``ptxas`` turns PTX into a cubin, ``nvdisasm`` shows its SASS."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from flydsl.compiler import settings
from flydsl.compiler.errors import PerformanceWarning, ToolchainError
from flydsl.compiler.tracing import warn_at_user_code

__all__ = [
    "find_ptxas",
    "fingerprint",
    "assemble_ptx",
    "assemble_with_notes",
    "warn_performance_notes",
    "find_nvdisasm",
    "disassemble_cubin",
]


def find_ptxas() -> str | None:
    """``FLYDSL_PTXAS``, then ``PATH``, then ``$CUDA_HOME/bin``, then ``/usr/local/cuda/bin``; None if absent."""
    config = settings.current()
    if config.ptxas:
        if not os.access(config.ptxas, os.X_OK):
            raise ToolchainError(f"FLYDSL_PTXAS={config.ptxas!r} is not an executable file")
        return config.ptxas
    candidates = [shutil.which("ptxas")]
    if config.cuda_home:
        candidates.append(str(Path(config.cuda_home) / "bin" / "ptxas"))
    candidates.append("/usr/local/cuda/bin/ptxas")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def fingerprint() -> str:
    """The assembler as the kernel cache key needs it: the ptxas that would run (path, size, modification time) and
    what its ``--version`` prints (run once per binary: kept in the disk cache as a record); ``"no ptxas"`` without
    one. Its flags are this module's code (``-arch`` from the target), which the compiler fingerprint covers."""
    try:
        ptxas = find_ptxas()
    except ToolchainError as error:  # compiling will raise it
        return str(error)
    if ptxas is None:
        return "no ptxas"
    stat = os.stat(ptxas)
    version = _ptxas_version(ptxas, stat.st_size, stat.st_mtime_ns)
    return f"{ptxas} ({stat.st_size} bytes, {stat.st_mtime_ns}): {version}"


@functools.lru_cache(maxsize=8)
def _ptxas_version(ptxas: str, size: int, mtime_ns: int) -> str:
    from flydsl.compiler import cache  # cache -> pipeline -> this module

    key = cache.key_text("ptxas --version", ptxas, size, mtime_ns)
    record = cache.load_record(key)
    if record is not None:  # a process start saves the ~6 ms of running it
        return record["version"]
    try:
        result = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"--version failed: {error}"
    version = result.stdout + result.stderr
    if result.returncode == 0:
        cache.store_record(key, {"version": version})
    return version


def assemble_ptx(ptx: str, arch: str, ptxas: str | None = None, extra_args: tuple[str, ...] = ()) -> bytes:
    """Assembles ``ptx`` for ``arch`` (e.g. ``sm_90a``) into a cubin; a failure raises ToolchainError with the log,
    and each "Potential Performance Loss" note of ptxas becomes a :class:`PerformanceWarning` (ptxas prints them
    even without ``-v``: e.g. C7514, every wgmma of a kernel serialized, costs a GEMM 10-25%)."""
    cubin, notes = assemble_with_notes(ptx, arch, ptxas, extra_args)
    warn_performance_notes(notes)
    return cubin


def assemble_with_notes(
    ptx: str, arch: str, ptxas: str | None = None, extra_args: tuple[str, ...] = ()
) -> tuple[bytes, tuple[str, ...]]:
    """:func:`assemble_ptx` without warning: (the cubin, ptxas's "Potential Performance Loss" notes). The compile
    pipeline keeps the notes in its module (and the disk cache), so that a cached kernel warns again."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise ToolchainError("ptxas not found: set FLYDSL_PTXAS or CUDA_HOME, or put the CUDA toolkit's bin on PATH")
    with tempfile.TemporaryDirectory(prefix="flydsl-ptxas-") as tmp:
        source, output = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        result = subprocess.run(
            [ptxas, f"-arch={arch}", *extra_args, "-o", str(output), str(source)], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ToolchainError(f"ptxas -arch={arch} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        lines = (result.stdout + result.stderr).splitlines()
        notes = tuple(f"ptxas -arch={arch}: {line.strip()}" for line in lines if "Performance Loss" in line)
        return output.read_bytes(), notes


def warn_performance_notes(notes) -> None:
    """Each note (from :func:`assemble_with_notes`) as a :class:`PerformanceWarning`, attributed to the first caller
    outside FlyDSL (the user's line that compiled or launched the kernel, however deep the compile ran)."""
    for note in notes:
        warn_at_user_code(note, PerformanceWarning)


def find_nvdisasm() -> str | None:
    """``nvdisasm`` next to ptxas, on ``PATH``, in the CUDA toolkit, or from the ``nvidia-cuda-nvdisasm`` wheel;
    None if absent."""
    ptxas = find_ptxas()
    candidates = [str(Path(ptxas).resolve().with_name("nvdisasm")) if ptxas else None, shutil.which("nvdisasm")]
    config = settings.current()
    if config.cuda_home:
        candidates.append(str(Path(config.cuda_home) / "bin" / "nvdisasm"))
    candidates.append("/usr/local/cuda/bin/nvdisasm")
    spec = importlib.util.find_spec("nvidia")  # the NVIDIA wheels' namespace package
    for root in (spec.submodule_search_locations or ()) if spec else ():
        candidates += sorted(str(p) for p in Path(root).glob("cu*/bin/nvdisasm"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def disassemble_cubin(cubin: bytes) -> str | None:
    """The SASS of a cubin (``nvdisasm``), or None when nvdisasm is not installed (``pip install
    nvidia-cuda-nvdisasm`` brings it)."""
    tool = find_nvdisasm()
    if tool is None:
        return None
    with tempfile.TemporaryDirectory(prefix="flydsl-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        result = subprocess.run([tool, str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolchainError(f"nvdisasm failed ({result.returncode}):\n{result.stderr}")
    return result.stdout

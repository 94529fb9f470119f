"""Getting a llama.cpp build: from the PyPI source distribution of llama-cpp-python,
built once per machine into the Conductor cache and reused afterwards.

Layout under <cache>/llama.cpp/<version>/:
    download/   the sdist as pip fetched it
    src/        the unpacked sdist (llama.cpp itself is src/vendor/llama.cpp)
    build/      the CMake build; binaries and their shared libraries in build/bin
    build.log   everything CMake printed
    build-info.json  written last, only after a complete build: its presence
                 (with matching settings) is what makes a second run quick
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import time
from pathlib import Path

from .errors import BenchError
from .procs import run_logged, run_quick

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as published on PyPI (checked after download).
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# The tools the bench scripts use; building only these keeps the build to ~10 min on 2 cores.
TOOLS = ("llama-bench", "llama-completion", "llama-perplexity", "llama-tokenize")

BASE_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)

# ggml at the commit vendored by llama-cpp-python 0.3.36 has an AMX matmul kernel
# that dies with SIGILL/SIGSEGV on prompt processing (its tile configuration is
# built on the stack and can be optimised away; see ggml-org/llama.cpp PR #26954).
# ggml compiles that kernel in whenever -march=native implies AMX-INT8, so on
# CPUs that advertise AMX we build without it; llama.cpp then uses its AVX-512 /
# AVX2 kernels, exactly as on any CPU without AMX.
NO_AMX_COMPILER_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def conductor_home() -> Path:
    """${CONDUCTOR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/conductor}, like `conductor fetch`."""
    if os.environ.get("CONDUCTOR_HOME"):
        return Path(os.environ["CONDUCTOR_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "conductor"


def cache_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return conductor_home() / "llama.cpp" / version


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_fingerprint() -> str:
    """Identifies the CPU's instruction sets: the build uses -march=native, so a cache
    copied to (or shared with) a different CPU must be rebuilt."""
    return hashlib.sha256(" ".join(sorted(_cpu_flags())).encode()).hexdigest()[:16]


def wanted_cmake_flags() -> list[str]:
    flags = list(BASE_CMAKE_FLAGS)
    if platform.machine() in ("x86_64", "AMD64") and any(f.startswith("amx") for f in _cpu_flags()):
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX_COMPILER_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_COMPILER_FLAGS}"]
    return flags


@dataclasses.dataclass
class LlamaCppBuild:
    bin_dir: Path
    version: str  # llama-cpp-python version the source came from
    commit: str  # llama.cpp commit (short hash), from the binaries' build info
    build_number: str
    cmake_flags: list[str]

    def tool(self, name: str) -> Path:
        return self.bin_dir / name


@contextlib.contextmanager
def _exclusive_lock(path: Path):
    """Serialise builds: two scripts started together must not build into one tree."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process building llama.cpp (lock {path}) ...", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _stamp_matches(stamp: dict, flags: list[str], bin_dir: Path) -> bool:
    return (
        stamp.get("version") == LLAMA_CPP_PYTHON_VERSION
        and stamp.get("cmake_flags") == flags
        and stamp.get("cpu_fingerprint") == cpu_fingerprint()
        and all(os.access(bin_dir / t, os.X_OK) for t in TOOLS)
    )


def _read_stamp(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ensure_llama_cpp(log=lambda msg: print(msg, file=sys.stderr)) -> LlamaCppBuild:
    """Return the cached build, building it first if it is missing or was built differently."""
    root = cache_dir()
    bin_dir = root / "build" / "bin"
    flags = wanted_cmake_flags()
    stamp_path = root / "build-info.json"

    stamp = _read_stamp(stamp_path)
    if not _stamp_matches(stamp, flags, bin_dir):
        with _exclusive_lock(root / ".lock"):
            stamp = _read_stamp(stamp_path)  # someone may have finished while we waited
            if not _stamp_matches(stamp, flags, bin_dir):
                stamp = _build(root, flags, log)
                stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return LlamaCppBuild(bin_dir=bin_dir, version=stamp["version"], commit=stamp["commit"],
                         build_number=str(stamp.get("build_number", "")), cmake_flags=stamp["cmake_flags"])


def _build(root: Path, flags: list[str], log) -> dict:
    _ensure_build_tools(log)
    src = _ensure_source(root, log)
    build_dir = root / "build"
    log_path = root / "build.log"
    log_path.write_text("")
    # A build configured with other flags (or half-done by an older script) is
    # thrown away rather than patched: CMake caches flags in surprising ways.
    if build_dir.exists():
        shutil.rmtree(build_dir)
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    log(f"building llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} with {jobs} jobs "
        f"(about 10 min on 2 cores); log: {log_path}")
    if any("amx" in f for f in flags):
        log("  (this CPU has AMX: building without ggml's AMX kernel, which crashes at this llama.cpp commit)")
    started = time.monotonic()
    run_logged(["cmake", "-S", src, "-B", build_dir, *flags], log_path)

    def report_progress():
        percents = re.findall(r"^\[\s*(\d+)%\]", log_path.read_text(errors="replace"), re.M)
        done = f"{percents[-1]}%" if percents else "starting"
        log(f"  ... still building llama.cpp: {done}, {(time.monotonic() - started) / 60:.0f} min so far")

    run_logged(["cmake", "--build", build_dir, "--config", "Release", "-j", str(jobs), "--target", *TOOLS],
               log_path, heartbeat=report_progress)
    missing = [t for t in TOOLS if not os.access(build_dir / "bin" / t, os.X_OK)]
    if missing:
        raise BenchError(f"llama.cpp build finished but {', '.join(missing)} is missing from {build_dir / 'bin'}; "
                         f"see {log_path}")
    commit, number = _binary_build_info(build_dir / "bin" / "llama-bench")
    log(f"llama.cpp {commit} built in {(time.monotonic() - started) / 60:.1f} min")
    return {
        "version": LLAMA_CPP_PYTHON_VERSION,
        "commit": commit,
        "build_number": number,
        "cmake_flags": flags,
        "cpu_fingerprint": cpu_fingerprint(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# llama-server, for bench/vs-llama-server: built on demand into the same cached build, its
# web UI left out (no npm build, no download of prebuilt assets: the bench needs the API only).
SERVER_CMAKE_FLAGS = ("-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF")


def ensure_llama_server(log=lambda msg: print(msg, file=sys.stderr)) -> Path:
    """Path of llama-server in the cached build (ensure_llama_cpp's), building that one target
    first if it is missing. The build's stamp (build-info.json) keeps describing the tools:
    turning the server on adds targets without changing how the others are compiled."""
    build = ensure_llama_cpp(log)
    server = build.tool("llama-server")
    if os.access(server, os.X_OK):
        return server
    root = cache_dir()
    with _exclusive_lock(root / ".lock"):
        if os.access(server, os.X_OK):
            return server
        src = _ensure_source(root, log)
        build_dir = root / "build"
        log_path = root / "build-server.log"
        log_path.write_text("")
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        log(f"building llama-server into {build_dir} with {jobs} jobs; log: {log_path}")
        started = time.monotonic()
        run_logged(["cmake", "-S", src, "-B", build_dir, *build.cmake_flags, *SERVER_CMAKE_FLAGS], log_path)
        run_logged(["cmake", "--build", build_dir, "--config", "Release", "-j", str(jobs),
                    "--target", "llama-server"], log_path)
        if not os.access(server, os.X_OK):
            raise BenchError(f"the llama-server build finished but {server} is missing; see {log_path}")
        log(f"llama-server built in {(time.monotonic() - started) / 60:.1f} min")
    return server


def _binary_build_info(llama_bench: Path) -> tuple[str, str]:
    """`llama-bench --version` prints e.g. 'version: 0.5.0-dev (build 1, commit 0c1e570)'."""
    out = run_quick([llama_bench, "--version"])
    m = re.search(r"build (\d+), commit (\w+)", out.stdout + out.stderr)
    if not m:
        raise BenchError(f"{llama_bench} --version did not print its build info:\n{out.stdout}{out.stderr}")
    return m.group(2), m.group(1)


def _ensure_build_tools(log) -> None:
    """cmake, make and a C++ compiler; installed with apt-get when missing and we are root."""
    needed = {"cmake": "cmake", "make": "make", "c++": "g++"}
    missing_pkgs = sorted({pkg for tool, pkg in needed.items() if shutil.which(tool) is None})
    if not missing_pkgs:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BenchError(f"building llama.cpp needs {', '.join(missing_pkgs)}; install them "
                         f"(e.g. `apt-get install -y {' '.join(missing_pkgs)}`) and run again")
    log(f"installing {', '.join(missing_pkgs)} with apt-get ...")
    env_log = cache_dir() / "apt.log"
    env_log.parent.mkdir(parents=True, exist_ok=True)
    run_logged(["apt-get", "update"], env_log)
    run_logged(["apt-get", "install", "-y", "--no-install-recommends", *missing_pkgs], env_log)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _ensure_source(root: Path, log) -> Path:
    """Download (pip, PyPI only) and unpack the sdist; return the llama.cpp source dir."""
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    src_dir = root / "src" / name / "vendor" / "llama.cpp"
    if (src_dir / "CMakeLists.txt").exists():
        return src_dir
    download = root / "download"
    download.mkdir(parents=True, exist_ok=True)
    sdist = download / f"{name}.tar.gz"
    if not sdist.exists() or _sha256(sdist) != SDIST_SHA256:
        log(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} source from PyPI ...")
        run_logged([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", download], root / "download.log")
    if not sdist.exists():
        raise BenchError(f"pip did not produce {sdist}; see {root / 'download.log'}")
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise BenchError(f"{sdist.name} has sha256 {digest}, expected {SDIST_SHA256}; deleted it, run again")
    # Unpack next to the final place and rename, so an interrupted unpack never looks complete.
    partial = root / "src.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and paths leaving the dir
            tar.extractall(partial, filter="data")
        else:
            tar.extractall(partial)
    if (root / "src").exists():
        shutil.rmtree(root / "src")
    partial.rename(root / "src")
    if not (src_dir / "CMakeLists.txt").exists():
        raise BenchError(f"the sdist has no vendor/llama.cpp/CMakeLists.txt (looked in {src_dir})")
    return src_dir

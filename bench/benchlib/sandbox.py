"""Memory limits (Linux memory cgroups) and page-cache control for benchmark runs.

Each run gets a fresh child cgroup with the limit, created just before the run
and removed right after it, so one run's page cache and peak never count
against the next. Three ways to get one, tried in this order:
  * cgroup v2: a child of our own cgroup (or of the hierarchy root) where the
    memory controller is enabled;
  * cgroup v1: a child of our own cgroup in the `memory` hierarchy;
  * systemd-run --scope -p MemoryMax=... (systemd hosts without write access).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from .errors import BenchError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_memory_limit(text: str, model_bytes: int, minimum: int = 4 << 20) -> int:
    """'50%' (of the model file), '123456' (bytes), '512MiB', '1.5G', ... -> bytes.

    K/M/G are binary (1024-based) whether or not an `i` is written: these are
    memory sizes, and cgroup limits are page-granular anyway. Sizes below
    `minimum` are refused (no engine starts in less than 4 MiB).
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[a-zA-Z]*)\s*", text)
    if not m:
        raise BenchError(f"--memory {text!r}: expected e.g. 50%, 300MiB, 1G or a byte count")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        limit = int(model_bytes * value / 100)
    elif unit in _UNITS:
        limit = int(value * _UNITS[unit])
    else:
        raise BenchError(f"--memory {text!r}: unknown unit {m.group(2)!r} (use %, B, KiB, MiB, GiB)")
    if limit < minimum:
        raise BenchError(f"--memory {text!r} is {limit} bytes; below 4 MiB no engine can even start")
    return limit


@dataclasses.dataclass
class CellResult:
    """What the kernel says about one run's cgroup after the run."""

    peak_bytes: int | None = None  # cgroup peak usage: RSS plus page cache charged to it
    oom_kills: int | None = None


class _Cell:
    """One run's cgroup: how to enter it, how to read it back."""

    def __init__(self, join: Callable[[], None] | None, wrap: Callable[[list[str]], list[str]] | None):
        self.join = join  # runs in the child between fork and exec
        self.wrap = wrap or (lambda cmd: cmd)  # rewrites the command (systemd-run)
        self.result = CellResult()


class MemoryLimiter:
    """Creates per-run cgroups capped at `limit_bytes` (no swap where the kernel allows saying so).

    `limit_bytes` may be set after detection (a limit in % needs the model's size);
    it must be set before the first `cell()`.
    """

    def __init__(self, mechanism: str, parent: Path | None, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self.mechanism = mechanism  # "cgroup v2" | "cgroup v1" | "systemd-run"
        self.parent = parent
        self._counter = 0

    @classmethod
    def detect(cls, limit_bytes: int | None = None) -> "MemoryLimiter":
        """Find a usable mechanism (checked by creating and removing one cgroup)
        or raise BenchError saying why there is none."""
        reasons = []
        for probe in (_probe_cgroup_v2, _probe_cgroup_v1, _probe_systemd_run):
            mechanism, parent, why_not = probe()
            if mechanism:
                limiter = cls(mechanism, parent, limit_bytes)
                limiter._self_test()
                return limiter
            reasons.append(why_not)
        raise BenchError("--memory is not supported here because no memory cgroup can be created:\n  - "
                         + "\n  - ".join(reasons))

    def describe(self) -> str:
        where = f" under {self.parent}" if self.parent else ""
        return f"{self.mechanism}{where}"

    def _self_test(self) -> None:
        """Create and remove one cgroup now, so a permission problem shows before any build or run."""
        if self.mechanism == "systemd-run":
            return
        with self.cell(test_only=True):
            pass

    @contextlib.contextmanager
    def cell(self, test_only: bool = False):
        """A fresh cgroup for one run: enter it with `cell.join` / `cell.wrap`, read
        `cell.result` after the run; removed on exit."""
        if not test_only and not self.limit_bytes:
            raise AssertionError("MemoryLimiter.limit_bytes must be set before running anything")
        self._counter += 1
        if self.mechanism == "systemd-run":
            cell = _Cell(None, self._systemd_wrap)
            yield cell
            return
        path = self.parent / f"conductor-bench-{os.getpid()}-{self._counter}"
        try:
            path.mkdir()
        except OSError as e:
            raise BenchError(f"cannot create cgroup {path}: {e.strerror}") from e
        try:
            if not test_only:
                self._set_limits(path)
            cell = _Cell(_joiner(path / "cgroup.procs"), None)
            yield cell
            cell.result = self._read_result(path)
        finally:
            _remove_cgroup(path)

    def _set_limits(self, path: Path) -> None:
        try:
            if self.mechanism == "cgroup v2":
                (path / "memory.max").write_text(str(self.limit_bytes))
                _write_if_present(path / "memory.swap.max", "0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
                # memory+swap = memory: the limited run may not swap (absent when swap accounting is off).
                _write_if_present(path / "memory.memsw.limit_in_bytes", str(self.limit_bytes))
        except OSError as e:
            raise BenchError(f"cannot set the memory limit on {path}: {e.strerror}") from e

    def _read_result(self, path: Path) -> CellResult:
        if self.mechanism == "cgroup v2":
            peak = _read_int(path / "memory.peak")  # kernels >= 5.19
            oom = _read_keyed(path / "memory.events", "oom_kill")
        else:
            peak = _read_int(path / "memory.max_usage_in_bytes")
            oom = _read_keyed(path / "memory.oom_control", "oom_kill")  # kernels >= 4.13
        return CellResult(peak_bytes=peak, oom_kills=oom)

    def _systemd_wrap(self, cmd: list[str]) -> list[str]:
        return ["systemd-run", "--scope", "--quiet", "--collect", "-p", f"MemoryMax={self.limit_bytes}",
                "-p", "MemorySwapMax=0", "--", *cmd]


def _joiner(procs_file: Path) -> Callable[[], None]:
    def join() -> None:
        # Runs in the forked child: move itself into the cgroup before exec.
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))

    return join


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        path.write_text(value)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return None


def _remove_cgroup(path: Path) -> None:
    """rmdir the cgroup; it can stay busy for a moment while the kernel finishes the exit."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                break
            time.sleep(0.1)
    print(f"warning: could not remove cgroup {path}; remove it with `rmdir {path}`", file=sys.stderr)


def _mounts(fstype: str) -> list[tuple[Path, str, set[str]]]:
    """(mount point, root inside the hierarchy, super options) of each mount of `fstype`."""
    found = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] == fstype:
                found.append((Path(fields[4]), fields[3], set(rfields[2].split(",")) if len(rfields) > 2 else set()))
    except OSError:
        pass
    return found


def _own_cgroup(controller: str | None) -> str | None:
    """Our path in the hierarchy with `controller` (None: the v2 unified hierarchy)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",") if controllers else []
            if (controller is None and controllers == "") or (controller in names):
                return path
    except (OSError, ValueError):
        pass
    return None


def _inside(mount: Path, mount_root: str, cgroup_path: str) -> Path | None:
    """Directory of `cgroup_path` under a mount whose root is `mount_root` (None if not visible)."""
    if mount_root != "/" and not (cgroup_path + "/").startswith(mount_root.rstrip("/") + "/"):
        return None
    rel = cgroup_path[len(mount_root.rstrip("/")):] if mount_root != "/" else cgroup_path
    return mount / rel.lstrip("/")


def _probe_cgroup_v2() -> tuple[str | None, Path | None, str]:
    mounts = _mounts("cgroup2")
    if not mounts:
        return None, None, "cgroup v2: not mounted"
    own = _own_cgroup(None) or "/"
    problems = []
    for mount, mount_root, _ in mounts:
        candidates = [p for p in (_inside(mount, mount_root, own), mount) if p is not None]
        for parent in dict.fromkeys(candidates):
            controllers = _read_words(parent / "cgroup.controllers")
            if "memory" not in controllers:
                problems.append(f"{parent}: memory controller not available "
                                f"(controllers: {' '.join(sorted(controllers)) or 'none'})")
                continue
            if "memory" not in _read_words(parent / "cgroup.subtree_control"):
                try:
                    (parent / "cgroup.subtree_control").write_text("+memory")
                except OSError as e:
                    problems.append(f"{parent}: cannot enable memory for children ({e.strerror})")
                    continue
            if not os.access(parent, os.W_OK):
                problems.append(f"{parent}: not writable")
                continue
            return "cgroup v2", parent, ""
    return None, None, "cgroup v2: " + "; ".join(problems)


def _probe_cgroup_v1() -> tuple[str | None, Path | None, str]:
    mounts = [m for m in _mounts("cgroup") if "memory" in m[2]]
    if not mounts:
        return None, None, "cgroup v1: no memory hierarchy mounted"
    mount, mount_root, _ = mounts[0]
    own = _own_cgroup("memory") or "/"
    parent = _inside(mount, mount_root, own) or mount
    if not (parent / "memory.limit_in_bytes").exists():
        return None, None, f"cgroup v1: {parent} has no memory.limit_in_bytes"
    if not os.access(parent, os.W_OK):
        return None, None, f"cgroup v1: {parent} is not writable (needs root)"
    return "cgroup v1", parent, ""


def _probe_systemd_run() -> tuple[str | None, Path | None, str]:
    if shutil.which("systemd-run") is None:
        return None, None, "systemd-run: not installed"
    if not Path("/run/systemd/system").is_dir():
        return None, None, "systemd-run: systemd is not the init system here"
    return "systemd-run", None, ""


def _read_words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def drop_page_cache() -> None:
    """Flush dirty pages, then drop the whole page cache (needs root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        raise BenchError(f"--cold needs root to write /proc/sys/vm/drop_caches: {e.strerror}") from e


def evict_file_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget `path`'s cached pages (no root needed; mapped pages stay).

    Under --memory this runs before every run: a page already in the page cache
    stays charged to the cgroup that read it first (e.g. this script hashing the
    model), so without eviction the model would escape the limit.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: Path) -> int | None:
    """How much of `path` is in the page cache right now (mincore over a fresh mapping).

    Used after eviction under --memory: pages that stay cached (because another
    process has the file mapped) are charged to that process's cgroup, so they
    escape the limit and make the limited run look better than it is.
    """
    import ctypes
    import mmap

    size = path.stat().st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) * page
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_copy(model: Path, directory: Path):
    """A copy of `model` that no other process has mapped, deleted afterwards.

    Under --memory the limit only binds pages that the limited run itself brings
    into the page cache; a model that another process keeps mapped stays cached
    and charged to that process. A private copy (a different inode) cannot be.
    """
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    size = model.stat().st_size
    if free < size + (256 << 20):
        raise BenchError(f"--memory copies the model to {directory} (so that no other process shares its page "
                         f"cache) but only {free >> 20} MiB are free there, {size >> 20} MiB needed")
    copy = directory / f"{os.getpid()}-{model.name}"
    try:
        shutil.copyfile(model, copy)
        with open(copy, "rb+") as f:
            os.fsync(f.fileno())  # written pages must be clean before they can be evicted
        evict_file_from_page_cache(copy)
        yield copy
    finally:
        copy.unlink(missing_ok=True)

"""Running child processes: with a timeout, optionally inside a memory cgroup,
measuring their peak RSS, and never leaving them behind.

Every child starts in its own session (process group) so that a timeout, a
Ctrl-C or a SIGTERM to the script kills the child *and* anything it spawned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from .errors import BenchError


class _Timeout(Exception):
    pass


@dataclasses.dataclass
class Finished:
    """What a measured child left behind."""

    cmd: list[str]
    returncode: int  # negative: killed by that signal (as in subprocess)
    stdout: str
    stderr: str
    wall_s: float
    max_rss_bytes: int  # ru_maxrss of the child (and its reaped descendants)
    timed_out: bool

    def describe_failure(self) -> str:
        """One paragraph saying how the child ended, with the end of its stderr."""
        if self.timed_out:
            how = f"timed out after {self.wall_s:.0f} s and was killed"
        elif self.returncode < 0:
            sig = -self.returncode
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            how = f"was killed by {name}"
            if sig == signal.SIGKILL:
                how += " (under a memory limit this is usually the OOM killer)"
            elif sig == signal.SIGILL:
                how += (" (an instruction this CPU or VM refused: a build for another CPU, or a broken "
                        "kernel such as ggml's AMX one, see bench/README.md)")
        else:
            how = f"exited with status {self.returncode}"
        tail = "\n".join(self.stderr.strip().splitlines()[-15:])
        return f"`{shlex.join(self.cmd)}` {how}." + (f"\n--- end of its stderr ---\n{tail}" if tail else "")


def _kill_group(pid: int) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left after 3 s."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _wait_with_timeout(pid: int, timeout_s: float | None) -> tuple[int, object, bool]:
    """Blocking wait4() on one child; a SIGALRM interrupts it at the deadline.

    Blocking (rather than polling) keeps this process asleep while the engine
    runs, so the measuring script itself adds no CPU noise.
    """

    def on_alarm(_signum, _frame):
        raise _Timeout()

    timed_out = False
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    try:
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            _, status, rusage = os.wait4(pid, 0)
        except _Timeout:
            timed_out = True
            _kill_group(pid)
            _, status, rusage = os.wait4(pid, 0)
    except BaseException:
        # Ctrl-C / SIGTERM while waiting: take the child down with us.
        signal.setitimer(signal.ITIMER_REAL, 0)
        _kill_group(pid)
        try:
            os.wait4(pid, 0)
        except ChildProcessError:
            pass
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
    # Whatever the child left running in its group (e.g. a stray helper) goes too.
    _kill_group(pid)
    return status, rusage, timed_out


def run_measured(
    cmd: Sequence[str],
    *,
    timeout_s: float | None = None,
    join_cgroup: Callable[[], None] | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Finished:
    """Run `cmd` to completion with stdin closed, capturing stdout/stderr and peak RSS.

    Peak RSS comes from the rusage that wait4() returns for this very child:
    the same kernel counter (ru_maxrss) that `/usr/bin/time -f %M` prints.
    `join_cgroup`, if given, runs in the child between fork and exec, so the
    engine is inside its cgroup from its first allocation.
    """
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out_f,
                stderr=err_f,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=join_cgroup,
            )
        except FileNotFoundError as e:
            raise BenchError(f"cannot run {cmd[0]}: {e.strerror}") from e
        except PermissionError as e:
            raise BenchError(f"cannot run {cmd[0]}: {e.strerror}") from e
        except subprocess.SubprocessError as e:
            # Raised when join_cgroup failed in the child.
            raise BenchError(f"could not start {cmd[0]} inside its cgroup: {e}") from e
        status, rusage, timed_out = _wait_with_timeout(proc.pid, timeout_s)
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it is reaped
        out_f.seek(0)
        err_f.seek(0)
        return Finished(
            cmd=cmd,
            returncode=proc.returncode,
            stdout=out_f.read().decode("utf-8", "replace"),
            stderr=err_f.read().decode("utf-8", "replace"),
            wall_s=wall,
            max_rss_bytes=rusage.ru_maxrss * 1024,  # Linux reports KiB
            timed_out=timed_out,
        )


def run_logged(cmd: Sequence[str], log_path: Path | None, *, cwd: Path | None = None,
               heartbeat: Callable[[], None] | None = None, heartbeat_s: float = 60.0) -> None:
    """Run a long build step, appending its output to `log_path` (or passing it to our
    stderr when None); raise BenchError on failure.

    `heartbeat` is called every `heartbeat_s` seconds while the step runs, so a
    ten-minute compile shows signs of life. The step runs in its own process
    group, killed as a whole if this script is interrupted.
    """
    cmd = [str(c) for c in cmd]
    with contextlib.ExitStack() as stack:
        if log_path is None:
            out = sys.stderr
        else:
            out = stack.enter_context(open(log_path, "ab"))
            out.write(f"\n$ {shlex.join(cmd)}\n".encode())
            out.flush()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=cwd, start_new_session=True)
        except OSError as e:
            raise BenchError(f"cannot run {cmd[0]}: {e.strerror}") from e
        try:
            while True:
                try:
                    rc = proc.wait(timeout=heartbeat_s)
                    break
                except subprocess.TimeoutExpired:
                    if heartbeat:
                        heartbeat()
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
    if rc != 0:
        if log_path is None:
            raise BenchError(f"`{shlex.join(cmd)}` failed (status {rc})")
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise BenchError(f"`{shlex.join(cmd)}` failed (status {rc}); full log: {log_path}\n"
                         f"--- end of the log ---\n{tail}")


def run_quick(cmd: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run a short helper command (git, --version, ...) and return its CompletedProcess."""
    try:
        return subprocess.run([str(c) for c in cmd], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise BenchError(f"cannot run {cmd[0]}: not found") from e
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"`{shlex.join(map(str, cmd))}` did not finish within {timeout_s} s") from e

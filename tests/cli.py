"""Running ``vitexplain`` as a user does: a new Python process on this checkout's code.

Each process pays for importing torch (seconds), so tests start the commands they need together
with :func:`run_cli_many` (a few at a time) and check several things per command.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Finished:
    """What a finished command left: exit code, output, peak resident memory (0 without /proc) and wall time."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float
    seconds: float


def python_env() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _start(args: list, cwd: str | Path | None) -> tuple:
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, *map(str, args)], stdout=out, stderr=err, cwd=cwd,
                               env=python_env(), text=True)
    return process, out, err, time.perf_counter()


def _peak_mb(pid: int) -> float:
    """The process's peak resident memory so far (Linux: VmHWM, which restarts at exec), 0 where unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0.0)


def _collect(process, out, err, start: float, peak_mb: float) -> Finished:
    out.seek(0)
    err.seek(0)
    result = Finished(process.returncode, out.read(), err.read(), peak_mb, time.perf_counter() - start)
    out.close()
    err.close()
    return result


def run_python_many(*commands: list, cwd: str | Path | None = None, parallel: int = 3,
                    timeout: float = 600) -> list[Finished]:
    """Run ``python ARGS...`` once per argument list, ``parallel`` at a time; the results in the same order.

    Each child's peak memory is read from ``/proc/PID/status`` while it runs (``ru_maxrss`` would
    count the memory of the test process it was forked from).
    """
    results: list[Finished | None] = [None] * len(commands)
    running: dict[int, tuple] = {}
    peaks: dict[int, float] = {}
    waiting = list(enumerate(commands))
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                index, args = waiting.pop(0)
                running[index] = _start(args, cwd)
            for index, (process, out, err, start) in list(running.items()):
                peaks[index] = max(peaks.get(index, 0.0), _peak_mb(process.pid))
                if process.poll() is not None:
                    results[index] = _collect(process, out, err, start, peaks[index])
                    del running[index]
                elif time.perf_counter() - start > timeout:
                    raise TimeoutError(f"python {' '.join(map(str, commands[index]))} ran longer than {timeout} s")
            time.sleep(0.02)
    finally:
        for process, *_ in running.values():
            process.kill()
            process.wait()
    return results


def run_cli_many(*commands: list, cwd: str | Path | None = None, parallel: int = 3,
                 timeout: float = 600) -> list[Finished]:
    """``vitexplain ARGS...`` once per argument list, ``parallel`` at a time (see :func:`run_python_many`)."""
    return run_python_many(*(["-m", "vitexplain.cli.main", *args] for args in commands), cwd=cwd,
                           parallel=parallel, timeout=timeout)


def run_cli(*args, cwd: str | Path | None = None, timeout: float = 600) -> Finished:
    """``vitexplain ARGS...`` in a new process."""
    return run_cli_many(list(args), cwd=cwd, timeout=timeout)[0]

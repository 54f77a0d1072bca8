"""Running ``vitexplain`` as a user does: a new Python process on this checkout's code.

Each new interpreter pays seconds for importing torch and torchvision (torchvision loads ``torch._dynamo``), so
tests start the commands they need together with :func:`run_cli_many` (a few at a time) and check several things
per command; and a ``python -m MODULE`` or ``python -c CODE`` command is forked from a server that has imported
the two already (the standard library's ``forkserver``, with them as its preload): a new process that runs the
module as ``__main__`` with the command's arguments, environment, import path, working directory and standard
streams, as ``python`` would. A command whose interpreter would start differently is a new interpreter: other
interpreter flags (``-X importtime``: the tests of what a command imports at start), another value of a variable
that Python, torch or the C libraries read when they start (``PYTHON*``, ``OMP_*``, ``TORCH*``, ...), a PYTHONPATH
that would shadow a preloaded module, or ``fork=False``. ``tests/test_cli_runner.py`` checks that both ways end
alike (docs/decisions/performance.md).
"""
from __future__ import annotations

import atexit
import importlib
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: what the fork server imports before it forks: the costly imports of every command, none of which reads a
#: variable that a test changes (huggingface_hub, and so timm, read ``HF_*`` when imported: they are not here)
PRELOADED = ("torch", "torchvision")
#: environment variables read when an interpreter, torch or a C library starts: a command whose value differs from
#: the fork server's is a new interpreter
AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "LD_",
            "MALLOC", "LC_", "LANG")


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
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *_python_path(os.environ)])}


class _Server:
    """The fork server of this test process, started at its first command (its environment is the process's then)."""

    context: multiprocessing.context.ForkServerContext | None = None
    environment: dict[str, str] = {}
    #: ``sys.path`` of a new interpreter without PYTHONPATH, less its first entry (the script's folder)
    installed: list[str] = []

    @classmethod
    def start(cls) -> None:
        """Make the server (once): its context, the environment it starts with, a bare interpreter's path."""
        if cls.context is not None:
            return
        cls.context = multiprocessing.get_context("forkserver")
        cls.context.set_forkserver_preload(list(PRELOADED))
        cls.environment = dict(os.environ)
        bare = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        cls.installed = json.loads(subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps("
                                                   "sys.path[1:]))"], env=bare, capture_output=True, text=True,
                                                  check=True).stdout)

    @classmethod
    def serves(cls, args: list, environment: dict[str, str]) -> bool:
        """Whether ``python ARGS`` with ``environment`` starts as a child of the (started) server would."""
        if not args or args[0] not in ("-m", "-c") or len(args) < 2:
            return False
        keys = {*environment, *cls.environment} - {"PYTHONPATH"}
        if any(key.startswith(AT_START) and environment.get(key) != cls.environment.get(key) for key in keys):
            return False
        # PYTHONPATH only makes the import path, which the child sets: it matters where it would shadow what the
        # server imported
        return not any(PathFinder.find_spec(name, [entry]) for entry in _python_path(environment)
                       for name in PRELOADED)


def _python_path(environment: dict[str, str]) -> list[str]:
    return [entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _as_python_would(args: list, environment: dict[str, str], cwd: str, out: str, err: str,
                     installed: list[str]) -> None:
    """In the forked child: run ``python ARGS`` (``-m MODULE ...`` or ``-c CODE ...``) and exit with its status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    for descriptor, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, descriptor)
        os.close(opened)
    option, target, *rest = args
    sys.path[:] = [cwd if option == "-m" else "", *_python_path(environment), *installed]
    importlib.invalidate_caches()  # the server's listings of folders may predate files a test wrote since
    status = 0
    try:
        if option == "-m":
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException as error:  # noqa: BLE001 - as python: the traceback from the command's frames, status 1
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        status = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _Forked:
    """A forked command seen through the part of ``subprocess.Popen`` that :func:`run_python_many` uses."""

    def __init__(self, args: list, environment: dict[str, str], cwd: str, out, err):
        self.process = _Server.context.Process(target=_as_python_would, args=(args, environment, cwd, out.name,
                                                                              err.name, _Server.installed))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    returncode = property(poll)

    def kill(self) -> None:
        self.process.kill()

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


def _start(args: list, cwd: str | Path | None, fork: bool) -> tuple:
    out, err = (tempfile.NamedTemporaryFile("w+") for _ in range(2))
    args, environment = list(map(str, args)), python_env()
    if fork:
        _Server.start()
    if fork and _Server.serves(args, environment):
        process = _Forked(args, environment, os.path.abspath(cwd or os.getcwd()), out, err)
    else:
        process = subprocess.Popen([sys.executable, *args], stdout=out, stderr=err, cwd=cwd, env=environment,
                                   text=True)
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


def run_python_many(*commands: list, cwd: str | Path | None = None, parallel: int = 3, timeout: float = 600,
                    fork: bool = True) -> list[Finished]:
    """Run ``python ARGS...`` once per argument list, ``parallel`` at a time; the results in the same order.
    ``fork=False``: each in a new interpreter, even where the fork server could run it (module docstring).

    Each child's peak memory is read from ``/proc/PID/status`` while it runs (``ru_maxrss`` would
    count the memory of the test process it was forked from); a forked child's starts from the server's resident
    memory, torch and torchvision, where a new interpreter's counts its own import of them.
    """
    results: list[Finished | None] = [None] * len(commands)
    running: dict[int, tuple] = {}
    peaks: dict[int, float] = {}
    waiting = list(enumerate(commands))
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                index, args = waiting.pop(0)
                running[index] = _start(args, cwd, fork)
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


def run_cli_many(*commands: list, cwd: str | Path | None = None, parallel: int = 3, timeout: float = 600,
                 fork: bool = True) -> list[Finished]:
    """``vitexplain ARGS...`` once per argument list, ``parallel`` at a time (see :func:`run_python_many`)."""
    return run_python_many(*(["-m", "vitexplain.cli.main", *args] for args in commands), cwd=cwd,
                           parallel=parallel, timeout=timeout, fork=fork)


def run_cli(*args, cwd: str | Path | None = None, timeout: float = 600) -> Finished:
    """``vitexplain ARGS...`` in a new process."""
    return run_cli_many(list(args), cwd=cwd, timeout=timeout)[0]

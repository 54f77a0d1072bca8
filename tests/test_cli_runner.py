"""The tests' command runner (``tests/cli.py``): a command forked from the preloaded server ends as the same
command in a new interpreter does, and a command the server cannot start as ``python`` would is a new interpreter."""
from __future__ import annotations

import json

from cli import run_cli_many, run_python_many

#: what a ``-c`` command sees of its start: arguments, module name, working folder, import path, one variable
REPORT = ("import json, os, sys; print(json.dumps([sys.argv, __name__, os.getcwd(), sys.path, "
          "os.environ.get('VITEXPLAIN_RUNNER_PROBE')])); sys.exit(int(sys.argv[1]))")


def _both(run, *commands, **options):
    """Each command's result forked and in a new interpreter, pairwise."""
    return list(zip(run(*commands, **options), run(*commands, fork=False, **options)))


def test_forked_commands_end_as_in_a_new_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("VITEXPLAIN_RUNNER_PROBE", "seen")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    unreadable = ["explain", "broken.png", "--model", "digits_vit", "--method", "rollout", "--no-progress"]
    cli = _both(run_cli_many, ["methods"], ["explain", "broken.png"], unreadable, cwd=tmp_path)
    code = _both(run_python_many, ["-c", REPORT, "3"], ["-c", "raise ValueError('a mistake')"],
                 ["-m", "json.tool", "missing.json"], cwd=tmp_path)
    for forked, new in cli + code:
        assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)
    assert cli[0][0].returncode == 0 and "gradtoken" in cli[0][0].stdout
    assert cli[1][0].returncode == 2 and "--model" in cli[1][0].stderr
    assert cli[2][0].returncode == 1 and "broken.png: not a readable image" in cli[2][0].stderr
    argv, name, cwd, path, probe = json.loads(code[0][0].stdout)
    assert (argv, name, cwd, path[0], probe, code[0][0].returncode) == (["-c", "3"], "__main__", str(tmp_path), "",
                                                                         "seen", 3)
    assert code[1][0].stderr.endswith("ValueError: a mistake\n") and code[2][0].returncode == 2


def test_a_variable_read_at_start_gives_a_new_interpreter(monkeypatch):
    probe = ["-c", "import torch; print(torch.get_num_threads())"]
    (before,) = run_python_many(probe)
    wanted = 1 if int(before.stdout) > 1 else 2
    monkeypatch.setenv("OMP_NUM_THREADS", str(wanted))
    (after,) = run_python_many(probe)
    assert int(after.stdout) == wanted


def test_pythonpath_is_the_import_path_and_a_shadowed_preload_gives_a_new_interpreter(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "probe.py").write_text("print('mine')\n")
    (tmp_path / "shadow" / "torch").mkdir(parents=True)
    (tmp_path / "shadow" / "torch" / "__init__.py").write_text("print('a torch of my own')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    ((forked, new),) = _both(run_python_many, ["-c", "import probe"])
    assert forked.stdout == new.stdout == "mine\n"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    (shadowed,) = run_python_many(["-c", "import torch"])
    assert shadowed.stdout == "a torch of my own\n"

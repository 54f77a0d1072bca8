"""No traceback for a user's error anywhere in the CLI: every subcommand is driven through the mistakes a user makes
(a missing file, a bad option value, an unknown name, a bad YAML key, an empty folder, a bench where no method
scores) and each must end with a non-zero exit code and one ``error:`` line naming the problem.

Importing vitexplain and torch costs seconds per process, so the cases run inside two processes (one for the
bench, one for the other commands, side by side), each calling the ``vitexplain`` entry point once per case as
the console script does (an exception escaping it is printed as Python prints it, a ``SystemExit`` gives its
code); one case also runs as a real ``vitexplain`` process to show the two report the same.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cli import run_cli, run_python_many
from test_hf_bert import make_bert, make_tokenizer

#: one case per line: the command line, the exit code, and what its error line must say
BENCH = ["bench", "--device", "cpu", "--no-progress"]
RUN = ["--model", "digits_vit", "--method", "random_baseline", "--metric", "sparseness"]
CASES = {
    "unknown command": (["bogus"], 2, "invalid choice: 'bogus'"),
    # bench
    "bench: missing config": ([*BENCH, "--config", "missing.yaml"], 2, "config file missing.yaml not found"),
    "bench: unknown YAML key": ([*BENCH, "--config", "badkey.yaml"], 2, "unknown bench config key(s) modles"),
    "bench: invalid YAML": ([*BENCH, "--config", "badsyntax.yaml"], 2, "badsyntax.yaml:2:1: invalid YAML"),
    "bench: YAML not a mapping": ([*BENCH, "--config", "list.yaml"], 2, "a bench config must be a mapping"),
    "bench: unknown method": ([*BENCH, *RUN[:2], "--method", "no_such_method", "--metric", "sparseness", "--dataset",
                               "digits"], 2, "unknown explanation method 'no_such_method'"),
    "bench: unknown metric": ([*BENCH, *RUN[:4], "--metric", "no_such_metric", "--dataset", "digits"], 2,
                              "unknown metric 'no_such_metric'"),
    "bench: unknown dataset": ([*BENCH, *RUN, "--dataset", "no_such_dataset"], 2, "unknown dataset 'no_such_dataset'"),
    "bench: unknown model": ([*BENCH, "--model", "no_such_model_xyz", "--offline", *RUN[2:], "--dataset", "digits",
                              "-o", "b1"], 2, "'no_such_model_xyz'"),
    "bench: missing checkpoint": ([*BENCH, "--model", "missing.safetensors", *RUN[2:], "--dataset", "digits", "-o",
                                   "b2"], 2, "missing.safetensors"),
    "bench: limit 0": ([*BENCH, *RUN, "--dataset", "digits", "--limit", "0"], 2,
                       "argument --limit: expected an integer >= 1, got 0"),
    "bench: batch size not a number": ([*BENCH, "--batch-size", "x"], 2,
                                       "argument --batch-size: expected an integer >= 1, got 'x'"),
    "bench: bad method option": ([*BENCH, *RUN[:2], "--method", "rise", "--method-option", "rise.n_masks=0",
                                  "--metric", "sparseness", "--dataset", "digits"], 2, "n_masks of method 'rise'"),
    "bench: option of no method": ([*BENCH, *RUN, "--method-option", "gae.start_layer=1", "--dataset", "digits"], 2,
                                   "'gae.start_layer=1' names no method of this run"),
    "bench: bad metric option": ([*BENCH, *RUN[:4], "--metric", "insertion_deletion", "--metric-option",
                                  "insertion_deletion.n_steps=zero", "--dataset", "digits"], 2,
                                 "n_steps of metric 'insertion_deletion'"),
    "bench: unknown dataset option": ([*BENCH, *RUN, "--dataset", "digits", "--dataset-option", "bogus=1", "-o",
                                       "b3"], 2, "dataset 'digits' has no option 'bogus'"),
    "bench: empty image folder": ([*BENCH, *RUN, "--dataset", "folder", "--dataset-option", "images=empty", "-o",
                                   "b4"], 2, "not found: empty"),
    "bench: unknown device": ([*BENCH[:1], *RUN, "--dataset", "digits", "--device", "tpu"], 2, "unknown device 'tpu'"),
    "bench: output is a file": ([*BENCH, *RUN, "--dataset", "digits", "-o", "afile"], 2, "output afile is a file"),
    "bench: a user's folder": ([*BENCH, *RUN, "--dataset", "digits", "-o", "users"], 2,
                               "users was not made by vitexplain and holds explorer.html, report.html, results.json"),
    "bench: no score at all": ([*BENCH, "--model", "digits_vit", "--method", "gradcam", "--metric", "sparseness",
                                "--dataset", "folder", "--dataset-option", "images=photos", "--dataset-option",
                                "labels=labels.csv", "--target", "label", "-o", "b5"], 1,
                               "no scores, every method failed on every image (digits_vit / gradcam: ValueError: "
                               "target 50 is outside the model's 10 classes)"),
    # explain
    "explain: missing image": (["explain", "missing.png", *RUN[:2], "--method", "rollout", "--device", "cpu",
                                "--no-progress", "-o", "e1"], 1, "missing.png: no such file"),
    "explain: not an image": (["explain", "afile", *RUN[:2], "--method", "rollout", "--device", "cpu", "--no-progress",
                               "-o", "e2"], 1, "afile: not a readable image"),
    "explain: unknown method": (["explain", "missing.png", *RUN[:2], "--method", "no_such_method"], 2,
                                "unknown explanation method 'no_such_method'"),
    "explain: unknown model": (["explain", "missing.png", "--model", "no_such_model_xyz", "--offline", "--method",
                                "rollout", "--device", "cpu"], 2, "'no_such_model_xyz'"),
    "explain: bad option value": (["explain", "missing.png", *RUN[:2], "--method", "rise", "-O", "n_masks=0",
                                   "--device", "cpu"], 2, "-O n_masks=0: option n_masks of method 'rise'"),
    "explain: unknown option": (["explain", "missing.png", *RUN[:2], "--method", "rise", "-O", "bogus=1", "--device",
                                 "cpu"], 2, "method 'rise' has no option 'bogus'"),
    "explain: class out of range": (["explain", "missing.png", *RUN[:2], "--method", "rollout", "--target", "99",
                                     "--device", "cpu"], 2, "--target 99 is not a class of this model"),
    "explain: batch size 0": (["explain", "missing.png", *RUN[:2], "--method", "rollout", "--batch-size", "0"], 2,
                              "argument --batch-size: expected an integer >= 1, got 0"),
    "explain: output is a file": (["explain", "missing.png", *RUN[:2], "--method", "rollout", "-o", "afile"], 2,
                                  "output afile is a file"),
    "explain: a user's explorer.html": (["explain", "missing.png", *RUN[:2], "--method", "rollout", "--html", "-o",
                                         "users"], 2, "holds explorer.html, which explain --html would replace"),
    # explain-text
    "explain-text: missing model": (["explain-text", "good", "--model", "nowhere"], 2, "no Hugging Face model in "
                                                                                       "nowhere"),
    "explain-text: unknown option": (["explain-text", "good", "--model", "bert", "-O", "bogus=1"], 2,
                                     "method 'gradtoken' has no option 'bogus'"),
    "explain-text: unknown method": (["explain-text", "good", "--model", "bert", "--method", "no_such", "--html",
                                      "t1.html"], 2, "unknown explanation method 'no_such'"),
    "explain-text: class out of range": (["explain-text", "good", "--model", "bert", "--target", "5", "--html",
                                          "t2.html"], 2, "target 5 is outside the model's 2 classes"),
    "explain-text: negative length": (["explain-text", "good", "--model", "bert", "--max-length", "-3"], 2,
                                      "argument --max-length: expected an integer >= 1, got -3"),
    "explain-text: html is a folder": (["explain-text", "good", "--model", "bert", "--html", "empty"], 2,
                                       "output empty is a folder, not a file"),
    # methods
    "methods: unknown flag": (["methods", "--bogus"], 2, "unrecognized arguments: --bogus"),
    "methods: missing plug-in": (["methods", "--plugin", "missing_plugin.py"], 2, "missing_plugin.py: no such"),
    # reproduce (no case loads a model: a recipe's models come from the Hub)
    "reproduce: no recipe": (["reproduce"], 2, "name a recipe"),
    "reproduce: unknown recipe": (["reproduce", "no-such-recipe"], 2, "unknown recipe 'no-such-recipe'"),
    "reproduce: bad --model": (["reproduce", "tokentm-table1", "--model", "vit", "-o", "r1"], 2,
                               "--model expects KEY=SOURCE, got 'vit'"),
    "reproduce: limit 0": (["reproduce", "tokentm-table1", "--limit", "0"], 2, "argument --limit: expected an integer"),
    "reproduce: output is a file": (["reproduce", "tokentm-table1", "-o", "afile"], 2, "output afile is a file"),
    # train
    "train: unknown architecture": (["train", "--arch", "no_such_vit", "--steps", "1", "-o", "t1/m.safetensors"], 2,
                                    "unknown timm architecture 'no_such_vit'"),
    "train: no steps": (["train", "--arch", "vit_tiny_patch16_224", "--steps", "0", "-o", "t2/m.safetensors",
                         "--device", "cpu"], 2, "steps must be a positive integer, got 0"),
    "train: missing teacher": (["train", "--arch", "deit_tiny_distilled_patch16_224", "--teacher",
                                "missing.safetensors", "--steps", "1", "-o", "t3/m.safetensors", "--device", "cpu"], 2,
                               "missing.safetensors"),
    "train: output is a folder": (["train", "--arch", "vit_tiny_patch16_224", "--steps", "1", "-o", "empty",
                                   "--device", "cpu"], 2, "output empty is a folder, not a file"),
    "train: no threads": (["train", "--arch", "vit_tiny_patch16_224", "--steps", "1", "-o", "t4/m.safetensors",
                           "--device", "cpu", "--threads", "0"], 2, "threads must be a positive integer, got 0"),
    "train: unknown readout": (["train", "--arch", "vit_tiny_patch16_224", "--steps", "1", "-o", "t5/m.safetensors",
                                "--global-pool", "max"], 2, "argument --global-pool: invalid choice: 'max'"),
}

#: runs ``vitexplain.cli.main.main`` once per case of the JSON argument, as the console script would, and prints
#: {case: [exit code, stderr]} as the last line
DRIVER = """
import contextlib, io, json, sys, traceback
from vitexplain.cli.main import main
found = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    found[name] = [code, err.getvalue()]
print(json.dumps(found))
"""


def _scene(folder: Path) -> None:
    """What the cases read: an empty folder, a file, YAML files, a user's folder, two photos labelled with a class
    digits_vit does not have, and a tiny text classifier."""
    (folder / "empty").mkdir()
    (folder / "afile").write_text("not an image\n")
    fields = "methods: [random_baseline]\nmetrics: [sparseness]\ndataset: digits\n"
    (folder / "badkey.yaml").write_text("modles: [digits_vit]\n" + fields)
    (folder / "badsyntax.yaml").write_text("models: [digits_vit\n")
    (folder / "list.yaml").write_text("- a\n- b\n")
    (folder / "users").mkdir()
    for name in ("report.html", "results.json", "explorer.html"):
        (folder / "users" / name).write_text("mine\n")
    (folder / "photos").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(folder / "photos" / f"p{i}.png")
    (folder / "labels.csv").write_text("file,label\np0,50\np1,50\n")
    make_bert(labels=2).save_pretrained(folder / "bert")
    make_tokenizer(folder).save_pretrained(folder / "bert")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("failures")
    _scene(folder)
    groups = [{name: case[0] for name, case in CASES.items() if name.startswith("bench")},
              {name: case[0] for name, case in CASES.items() if not name.startswith("bench")}]
    done = run_python_many(*(["-c", DRIVER, json.dumps(group)] for group in groups), cwd=folder, parallel=2,
                           timeout=300)
    found = {}
    for run in done:
        assert run.returncode == 0, run.stderr
        found.update(json.loads(run.stdout.splitlines()[-1]))
    real = run_cli(*CASES["bench: unknown YAML key"][0], cwd=folder, timeout=120)
    return folder, found, real


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize("case", list(CASES))
def test_a_users_mistake_is_one_line_and_no_traceback(finished, case):
    _, found, _ = finished
    argv, expected_code, says = CASES[case]
    code, stderr = found[case]
    assert "Traceback" not in stderr, stderr
    assert code == expected_code, stderr
    (line,) = _error_lines(stderr)            # argparse's usage, a dataset's layout may follow; one error line
    assert says in line, line


def test_the_driver_reports_what_the_command_does(finished):
    _, found, real = finished
    code, stderr = found["bench: unknown YAML key"]
    assert (real.returncode, real.stderr) == (code, stderr)


def test_a_bench_with_no_score_writes_reports_that_say_why(finished):
    folder, _, _ = finished
    out = folder / "b5"
    results = json.loads((out / "results.json").read_text())
    assert results["scores"] == {"digits_vit": {"gradcam": {}}}
    reason = "target 50 is outside the model's 10 classes"
    assert [error["error"] for error in results["errors"]] == [f"ValueError: {reason}"]
    for name in ("results.md", "report.html"):
        text = html.unescape((out / name).read_text())          # the page escapes the apostrophe
        assert "no scores: every method failed on every image" in text and reason in text, name
    assert not (folder / "users" / ".vitexplain-output").exists()            # the refused runs left it as it was
    assert sorted(p.name for p in (folder / "users").iterdir()) == ["explorer.html", "report.html", "results.json"]

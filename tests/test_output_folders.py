"""A folder is a bench's only if the bench made it: a user's folder holding files the bench writes is refused in
one line with nothing written, ``--force`` replaces them and says so; the bench's own folder (its marker, or the
results.json of a version from before the marker) is reused; a user's folder of other files is claimed and those
files are left as they were."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.lock import LOCK_NAME
from vitexplain.bench.writers import OUTPUT_NAMES, made_by_earlier_bench
from vitexplain.models import ModelLoadError
from vitexplain.output_folders import MARKER, FolderNotOurs, check_folder, claim, made_by_vitexplain

from cli import run_cli_many

ARGS = ["--model", "digits_vit", "--method", "random_baseline", "--metric", "sparseness", "--dataset", "digits",
        "--dataset-option", "n=2", "--device", "cpu", "--no-progress"]
USERS = {"report.html": b"<html>my own report</html>\n", "results.json": b'{"mine": [1, 2, 3]}\n',
         "results.md": b"# my notes\n", "explorer.html": b"<p>my explorer</p>\n"}


def _config(out: Path, **overrides) -> BenchConfig:
    fields = dict(models=["digits_vit"], methods=["random_baseline"], metrics=["sparseness"],
                  dataset={"name": "digits", "options": {"n": 2}}, output_dir=out, device="cpu", progress=False,
                  gallery=0)
    return BenchConfig(**{**fields, **overrides})


def _users_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, content in USERS.items():
        (folder / name).write_bytes(content)
    return folder


def test_a_users_report_files_are_refused_in_one_line_and_replaced_only_with_force(tmp_path):
    refused, forced = _users_folder(tmp_path / "refused"), _users_folder(tmp_path / "forced")
    no, yes = run_cli_many(["bench", *ARGS, "-o", refused], ["bench", *ARGS, "-o", forced, "--force"],
                           cwd=tmp_path, parallel=2, timeout=300)

    assert no.returncode == 2 and no.stdout == "", no.stderr
    (line,) = no.stderr.splitlines()
    assert line.startswith(f"error: output folder {refused} was not made by vitexplain and holds ")
    assert all(name in line for name in USERS) and "--force" in line
    assert {p.name: p.read_bytes() for p in refused.iterdir()} == USERS          # nothing replaced, nothing added

    assert yes.returncode == 0, yes.stderr
    said = [line for line in yes.stderr.splitlines() if line.startswith("warning: force: replacing")]
    assert len(said) == 1 and all(name in said[0] for name in USERS), yes.stderr
    results = json.loads((forced / "results.json").read_text())
    assert results["scores"]["digits_vit"]["random_baseline"]["sparseness"]      # the bench's results now
    assert (forced / "report.html").read_bytes() != USERS["report.html"]
    assert made_by_vitexplain(forced)

    again = run_benchmark(_config(forced))                   # the bench's folder now: no force needed, the cache used
    assert again.scores == results["scores"] and not again.errors


def test_a_folder_of_other_files_is_claimed_and_its_files_left_alone(tmp_path):
    out = tmp_path / "mine"
    (out / "photos").mkdir(parents=True)
    (out / "photos" / "a.png").write_bytes(b"not really a png")
    (out / "notes.txt").write_text("keep me\n")
    result = run_benchmark(_config(out))
    assert not result.errors and made_by_vitexplain(out)
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert (out / "photos" / "a.png").read_bytes() == b"not really a png"
    assert (out / "results.json").exists() and not (out / LOCK_NAME).exists()


def test_a_folder_of_an_earlier_version_is_recognised_by_its_results(tmp_path):
    out = tmp_path / "old"
    first = run_benchmark(_config(out))
    (out / MARKER).unlink()                              # as a bench from before the marker left it
    assert made_by_earlier_bench(out)
    again = run_benchmark(_config(out))
    assert again.scores == first.scores and made_by_vitexplain(out)


def test_a_refused_run_leaves_a_users_empty_folder_as_it_was(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(ModelLoadError):
        run_benchmark(_config(out, models=[str(tmp_path / "missing.safetensors")]))
    assert list(out.iterdir()) == []                    # no marker, no lock: as the user made it


def test_what_the_check_accepts_and_refuses(tmp_path):
    assert check_folder(tmp_path / "new", OUTPUT_NAMES, "bench") == []              # nothing there yet
    assert not (tmp_path / "new").exists()                                          # checking writes nothing
    (tmp_path / "file").write_text("x")
    with pytest.raises(FolderNotOurs, match="is a file"):
        check_folder(tmp_path / "file", OUTPUT_NAMES, "bench")
    users = tmp_path / "users"
    (users / "plots").mkdir(parents=True)
    with pytest.raises(FolderNotOurs, match="holds plots, which bench would replace"):
        check_folder(users, OUTPUT_NAMES, "bench")
    assert check_folder(users, OUTPUT_NAMES, "bench", force=True) == ["plots"]
    (users / "results.json").write_text("[1, 2]")                                   # JSON, but no bench's results
    assert not made_by_earlier_bench(users)
    assert claim(users, OUTPUT_NAMES, "bench", force=True) == ["plots", "results.json"]
    assert made_by_vitexplain(users) and check_folder(users, OUTPUT_NAMES, "bench") == []
    held = tmp_path / "held"                                  # a lock an earlier bench holds, nothing else: its folder
    held.mkdir()
    (held / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "h", "config": "c"}))
    assert made_by_earlier_bench(held)
    (held / "report.html").write_text("mine")
    assert not made_by_earlier_bench(held)

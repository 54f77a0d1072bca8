"""``vitexplain explain-text``: a local text classifier's tokens coloured by relevance, in the terminal and in HTML.

Each command runs as a user runs it, in a new process (tests/cli.py); they start together once.
"""
import os
import pty
import re
import subprocess
import sys

import pytest

import vitexplain

from cli import python_env, run_cli_many
from test_hf_bert import make_bert, make_tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    directory = folder / "bert"
    model = make_bert(labels=2)
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(directory)
    make_tokenizer(folder).save_pretrained(directory)
    commands = {
        "plain": ["the acting was awful and boring", "--model", "bert", "--method", "gae", "--target", "0",
                  "--html", "plain.html", "--no-color"],
        "missing_model": ["good", "--model", "none"],
        "bad_target": ["good", "--model", "bert", "--target", "5", "--html", "b.html"],
        "image_method": ["good", "--model", "bert", "--method", "rise", "--html", "c.html"],
    }
    finished = run_cli_many(*(["explain-text", *args] for args in commands.values()), cwd=folder)
    return folder, dict(zip(commands, finished))


def test_plain_output_and_html_hold_every_token_with_its_relevance(runs, tmp_path):
    folder, done = runs
    assert done["plain"].returncode == 0, done["plain"].stderr
    printed = done["plain"].stdout
    assert printed.startswith("negative (p=") and "\x1b[" not in printed
    tokens = re.findall(r"(\S+)\[([+-]\d\.\d\d)\]", printed)
    assert [t for t, _ in tokens] == ["the", "acting", "was", "awful", "and", "boring"]

    tokenizer, model = make_tokenizer(tmp_path), make_bert(labels=2)
    encoded = tokenizer("the acting was awful and boring", return_tensors="pt")
    relevance = vitexplain.explain(model, encoded, "gae", target=0)[0, 1:-1]
    scaled = relevance / relevance.abs().max()
    assert [float(v) for _, v in tokens] == pytest.approx(scaled.tolist(), abs=0.006)

    spans = re.findall(r'<span style="background-color: rgb\((\d+), (\d+), (\d+)\)" title="([^"]+)">([^<]+)</span>',
                       (folder / "plain.html").read_text())
    assert [s[-1] for s in spans] == ["the", "acting", "was", "awful", "and", "boring"]
    assert [float(s[3]) for s in spans] == pytest.approx(relevance.tolist(), rel=1e-3)
    strongest = int(relevance.abs().argmax())
    assert tuple(map(int, spans[strongest][:3])) in {(255, 0, 0), (0, 0, 255)}
    for (red, green, blue, *_), value in zip(spans, scaled.tolist()):
        fade = round(255 * (1 - abs(value)))
        assert (int(red), int(green), int(blue)) == ((255, fade, fade) if value >= 0 else (fade, fade, 255))


def test_a_terminal_gets_ansi_backgrounds_and_method_options_apply(runs, tmp_path):
    folder, _ = runs
    leader, follower = pty.openpty()  # stdout is a terminal, as in a shell
    try:
        process = subprocess.run(
            [sys.executable, "-m", "vitexplain.cli.main", "explain-text", "great movie", "--model", "bert",
             "--method", "rollout", "-O", "head_fusion=max", "--html", "a.html"],
            stdout=follower, stderr=subprocess.PIPE, cwd=folder, env=python_env(), timeout=600)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closes with the process
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert process.returncode == 0, process.stderr
    printed = b"".join(chunks).decode()
    assert printed.count("\x1b[30;48;2;") == 2 and "great" in printed and "movie" in printed

    tokenizer, model = make_tokenizer(tmp_path), make_bert(labels=2)
    encoding = tokenizer("great movie", return_tensors="pt")
    maxed = vitexplain.explain(model, encoding, "rollout", head_fusion="max")[0, 1:-1]
    meaned = vitexplain.explain(model, encoding, "rollout")[0, 1:-1]
    titles = [float(t) for t in re.findall(r'title="([^"]+)"', (folder / "a.html").read_text())]
    assert titles == pytest.approx(maxed.tolist(), rel=1e-3)
    assert titles != pytest.approx(meaned.tolist(), rel=1e-3)  # the option changed the map


def test_missing_model_bad_target_and_image_methods_are_reported(runs):
    _, done = runs
    assert done["missing_model"].returncode == 2
    assert "no Hugging Face model in" in done["missing_model"].stderr
    assert done["bad_target"].returncode == 2
    assert "outside the model's 2 classes" in done["bad_target"].stderr
    error = done["image_method"].stderr
    assert done["image_method"].returncode == 2
    assert "'rise' explains images only" in error and "gradtoken" in error
    for result in done.values():
        assert "Traceback" not in result.stderr

"""``vitexplain explain-text``: a local text classifier's tokens coloured by relevance, in the terminal and in HTML."""
import re

import pytest

import vitexplain
from vitexplain.cli.main import main

from test_hf_bert import make_bert, make_tokenizer


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "bert"
    model = make_bert(labels=2)
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(directory)
    make_tokenizer(tmp_path).save_pretrained(directory)
    return directory


def test_plain_output_and_html_hold_every_token_with_its_relevance(model_dir, tmp_path, capsys):
    page = tmp_path / "out.html"
    code = main(["explain-text", "the acting was awful and boring", "--model", str(model_dir), "--method", "gae",
                 "--target", "0", "--html", str(page), "--no-color"])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("negative (p=") and "\x1b[" not in printed
    tokens = re.findall(r"(\S+)\[([+-]\d\.\d\d)\]", printed)
    assert [t for t, _ in tokens] == ["the", "acting", "was", "awful", "and", "boring"]

    tokenizer, model = make_tokenizer(tmp_path), make_bert(labels=2)
    relevance = vitexplain.explain(model, tokenizer("the acting was awful and boring", return_tensors="pt"), "gae", target=0)[0, 1:-1]
    scaled = relevance / relevance.abs().max()
    assert [float(v) for _, v in tokens] == pytest.approx(scaled.tolist(), abs=0.006)

    spans = re.findall(r'<span style="background-color: rgb\((\d+), (\d+), (\d+)\)" title="([^"]+)">([^<]+)</span>', page.read_text())
    assert [s[-1] for s in spans] == ["the", "acting", "was", "awful", "and", "boring"]
    assert [float(s[3]) for s in spans] == pytest.approx(relevance.tolist(), rel=1e-3)
    strongest = int(relevance.abs().argmax())
    assert tuple(map(int, spans[strongest][:3])) in {(255, 0, 0), (0, 0, 255)}
    for (red, green, blue, *_), value in zip(spans, scaled.tolist()):
        fade = round(255 * (1 - abs(value)))
        assert (int(red), int(green), int(blue)) == ((255, fade, fade) if value >= 0 else (fade, fade, 255))


def test_a_terminal_gets_ansi_backgrounds(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert main(["explain-text", "great movie", "--model", str(model_dir), "--html", str(tmp_path / "a.html")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\x1b[30;48;2;") == 2 and "great" in printed and "movie" in printed


def test_missing_model_and_bad_target_are_reported(model_dir, tmp_path, capsys):
    assert main(["explain-text", "good", "--model", str(tmp_path / "none")]) == 2
    assert "no Hugging Face model in" in capsys.readouterr().err
    assert main(["explain-text", "good", "--model", str(model_dir), "--target", "5", "--html", str(tmp_path / "b.html")]) == 2
    assert "outside the model's 2 classes" in capsys.readouterr().err
    assert main(["explain-text", "good", "--model", str(model_dir), "--method", "rise", "--html", str(tmp_path / "c.html")]) == 2
    error = capsys.readouterr().err
    assert "'rise' explains images only" in error and "gradtoken" in error

"""Rationale token-F1 (GradToken Fig. 6) and the ERASER movies loader, down to a tiny BERT trained here."""
import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from vitexplain.bench import BenchConfig, MetricEntry, run_benchmark
from vitexplain.datasets.base import DatasetFormatError, DatasetNotFoundError, collate, get_dataset
from vitexplain.datasets.eraser import MovieReviews
from vitexplain.metrics import get_metric
from vitexplain.metrics.rationale_f1 import rationale_f1

from test_hf_bert import make_tokenizer


def loop_token_f1(maps, word_numbers, spans, ks):
    """ERASER token P/R/F1 of the top-k words, one review and one k at a time, as written in the protocol."""
    results = {"precision": [], "recall": [], "f1": []}
    for relevance, numbers, review_spans in zip(maps.tolist(), word_numbers.tolist(), spans):
        best = {}
        for score, number in zip(relevance, numbers):
            if number > 0:
                best[number - 1] = max(best.get(number - 1, 0.0), max(score, 0.0))
        ranking = sorted(best, key=lambda word: (-best[word], word))
        truth = {w for start, end in review_spans.tolist() for w in range(start, end)}
        rows = {name: [] for name in results}
        for k in ks:
            predicted = set(ranking[:k])
            hits = len(predicted & truth)
            p = hits / len(predicted) if predicted else 0.0
            r = hits / len(truth) if truth else 0.0
            rows["precision"].append(p)
            rows["recall"].append(r)
            rows["f1"].append(2 * p * r / (p + r) if p and r else 0.0)
        for name in results:
            results[name].append(rows[name])
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in results.items()}


def test_token_f1_equals_a_loop_over_words_and_spans():
    g = torch.Generator().manual_seed(0)
    maps = torch.randn(3, 12, generator=g)
    maps[0, 3] = maps[0, 5]  # a tie between two words: the earlier word wins
    maps[2] = maps[2].abs()
    # [CLS] w0 w0 w1 w2 w2 w2 w3 w4 [SEP] [PAD] [PAD] ; review 1 is truncated after word 7; review 2 has no rationale
    word_numbers = torch.tensor([[0, 1, 1, 2, 3, 3, 3, 4, 5, 0, 0, 0],
                                 [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 0],
                                 [0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0]])
    spans = [torch.tensor([[1, 3], [4, 5]]), torch.tensor([[2, 4], [6, 9], [20, 25]]),
             torch.zeros(0, 2, dtype=torch.long)]
    ks = (1, 2, 3, 4, 10)
    got = rationale_f1(maps, word_numbers, spans, ks)
    expected = loop_token_f1(maps, word_numbers, spans, ks)
    for name in ("precision", "recall", "f1"):
        torch.testing.assert_close(got[name], expected[name])
    # review 1 read words 0-7, of which 2, 3, 6, 7 are rationales, out of 10 in the whole review
    assert (got["f1"][2] == 0).all() and got["recall"][1, -1] == pytest.approx(4 / 10)


def test_metric_reports_the_mean_f1_per_k_and_over_k():
    metric = get_metric("rationale_f1")
    assert metric.options == {"ks": (10, 20, 30, 40, 50, 60, 70, 80)}
    assert set(metric.requires) == {"word_index", "rationale_spans"}
    values = {"f1@1": torch.tensor([0.5, 0.0]), "f1@2": torch.tensor([1.0, 0.5]),
              "f1": torch.tensor([[0.5, 1.0], [0.0, 0.5]]), "precision": torch.ones(2, 2), "recall": torch.ones(2, 2)}
    assert metric.reduce(values) == {"f1@1": 0.25, "f1@2": 0.75, "mean_f1": 0.5}


def write_movies(root, reviews, split="test"):
    """ERASER movies files: docs/<id> (one sentence per line) and <split>.jsonl; reviews = (words, label, spans)."""
    (root / "docs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (words, label, spans) in enumerate(reviews):
        docid = f"{label.lower()}R_{i:03d}.txt"
        half = len(words) // 2
        (root / "docs" / docid).write_text(" ".join(words[:half]) + "\n" + " ".join(words[half:]) + "\n")
        evidences = [[{"docid": docid, "start_token": s, "end_token": e, "text": " ".join(words[s:e]),
                       "start_sentence": -1, "end_sentence": -1}] for s, e in spans]
        lines.append(json.dumps({"annotation_id": docid, "classification": label, "evidences": evidences,
                                 "query": "What is the sentiment of this review?", "query_type": None}))
    (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def test_movies_loader_aligns_word_pieces_with_words(tmp_path):
    tokenizer = make_tokenizer(tmp_path, ["the", "plot", "was", "superb", "##ly", "bad", "acting"])
    write_movies(tmp_path / "movies", [("the plot was superbly bad acting".split(), "NEG", [(3, 5)]),
                                       ("superbly the plot".split(), "POS", [(0, 1), (1, 2)])])
    dataset = get_dataset("movies", tmp_path / "movies", preprocess=tokenizer, max_length=8)
    first, second = dataset[0], dataset[1]
    assert first["id"] == "negR_000.txt" and first["label"] == 0 and second["label"] == 1
    assert tokenizer.convert_ids_to_tokens(first["image"].tolist()) == \
        ["[CLS]", "the", "plot", "was", "superb", "##ly", "bad", "[SEP]"]  # truncated: "acting" is cut
    assert first["word_index"].tolist() == [0, 1, 2, 3, 4, 4, 5, 0]
    assert first["rationale_spans"].tolist() == [[3, 5]]
    assert second["image"].tolist()[-2:] == [0, 0] and second["word_index"].tolist() == [0, 1, 1, 2, 3, 0, 0, 0]
    batch = collate([first, second])
    assert batch["images"].shape == (2, 8) and batch["word_index"].shape == (2, 8)
    assert len(batch["rationale_spans"]) == 2
    one = get_dataset("movies", tmp_path / "movies", preprocess=tokenizer, n=1, seed=3)[0]
    assert one["id"] in {"negR_000.txt", "posR_001.txt"}


def test_movies_loader_errors_name_the_problem(tmp_path):
    tokenizer = make_tokenizer(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="test.jsonl(.|\n)*expected layout"):
        MovieReviews(tmp_path / "absent", preprocess=tokenizer)
    write_movies(tmp_path / "movies", [(["good"], "MAYBE", [])])
    with pytest.raises(DatasetFormatError, match="classified 'MAYBE'"):
        MovieReviews(tmp_path / "movies", preprocess=tokenizer)
    with pytest.raises(TypeError, match="needs a tokenizer as preprocess"):
        MovieReviews(tmp_path / "movies", preprocess={"input_size": (3, 224, 224)})
    with pytest.raises(FileNotFoundError, match="no tokenizer in"):
        MovieReviews(tmp_path / "movies", preprocess=tmp_path / "nowhere")
    (tmp_path / "movies" / "test.jsonl").write_text("{not json\n")
    with pytest.raises(DatasetFormatError, match="line 1 is not an ERASER annotation"):
        MovieReviews(tmp_path / "movies", preprocess=tokenizer)


POSITIVE = ["good", "great", "superb", "loved", "brilliant"]
NEGATIVE = ["bad", "awful", "boring", "hated", "dull"]
FILLER = ["the", "a", "movie", "plot", "actor", "scene", "was", "and", "it", "of", "story", "film", "with", "in",
          "this", "that", "director", "script", "music", "cast", "ending", "some", "very", "quite"]


def sentiment_reviews(count, generator):
    """Reviews of 14-20 filler words with 3 sentiment words of the label at random places (the rationales)."""
    reviews = []
    for _ in range(count):
        positive = bool(torch.randint(2, (1,), generator=generator))
        length = int(torch.randint(14, 21, (1,), generator=generator))
        words = [FILLER[i] for i in torch.randint(len(FILLER), (length,), generator=generator)]
        cues = POSITIVE if positive else NEGATIVE
        places = sorted(torch.randperm(length + 3, generator=generator)[:3].tolist())
        for place in places:
            words.insert(place, cues[int(torch.randint(len(cues), (1,), generator=generator))])
        reviews.append((words, "POS" if positive else "NEG", [(p, p + 1) for p in places]))
    return reviews


def train_tiny_bert(tokenizer, reviews, seed=0):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    encoding = tokenizer([words for words, _, _ in reviews], is_split_into_words=True, padding=True,
                         return_tensors="pt")
    labels = torch.tensor([label == "POS" for _, label, _ in reviews]).long()
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(6):
        for rows in torch.randperm(len(reviews), generator=order).split(32):
            loss = model(input_ids=encoding["input_ids"][rows], attention_mask=encoding["attention_mask"][rows],
                         labels=labels[rows]).loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return model.eval()


def test_a_trained_bert_points_at_the_rationales_through_the_bench(tmp_path):
    g = torch.Generator().manual_seed(0)
    tokenizer = make_tokenizer(tmp_path, POSITIVE + NEGATIVE + FILLER)
    model = train_tiny_bert(tokenizer, sentiment_reviews(480, g))
    write_movies(tmp_path / "movies", sentiment_reviews(24, g))
    dataset = MovieReviews(tmp_path / "movies", preprocess=tokenizer, max_length=32)
    batch = collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        accuracy = (model(input_ids=batch["images"]).logits.argmax(-1) == batch["labels"]).float().mean()
    assert accuracy > 0.9
    ks = [1, 2, 3, 5]
    result = run_benchmark(BenchConfig(
        models={"bert": model}, methods=["gae", "tokentm", "agcam"], metrics=[MetricEntry("rationale_f1", {"ks": ks})],
        dataset=dataset, batch_size=8, output_dir=tmp_path / "bench", device="cpu", target="label", gallery=0,
        progress=False))
    assert not result.errors
    noise = torch.rand(batch["images"].shape, generator=torch.Generator().manual_seed(1))
    chance = rationale_f1(noise, batch["word_index"], batch["rationale_spans"], ks)["f1"].mean().item()
    assert chance < 0.35
    for method in ("gae", "tokentm", "agcam"):  # gradient-weighted attention; the best possible mean F1 is 0.7625
        scores = result.scores["bert"][method]["rationale_f1"]
        assert set(scores) == {"f1@1", "f1@2", "f1@3", "f1@5", "mean_f1"}
        assert scores["mean_f1"] > chance + 0.3, (method, scores, chance)

"""ERASER Movie Reviews (DeYoung et al., ACL 2020; Zaidan & Eisner, 2008): reviews with human rationales.

The rationale test of GradToken (Cheng et al., Neural Networks 2024, Fig. 6), following Chefer et al.
(CVPR 2021, Sec. 4.2) and their code (hila-chefer/Transformer-Explainability,
``BERT_rationale_benchmark``): a BERT classifier reads each test review (its first ``max_length``
word pieces) and its explanation is compared with the words annotators marked as rationales
(:mod:`vitexplain.metrics.rationale_f1`).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .base import DatasetFormatError, DatasetNotFoundError, DictDataset, register_dataset, require

LAYOUT = """\
  root/{train,val,test}.jsonl   one annotation per line: {"annotation_id": "negR_000.txt",
                                "classification": "NEG" | "POS", "evidences": [[{"docid": "negR_000.txt",
                                "start_token": 113, "end_token": 117, ...}, ...], ...], ...}
  root/docs/<docid>             the review: one sentence per line, words separated by spaces"""


def resolve_tokenizer(preprocess: Any):
    """A fast transformers tokenizer: given, or loaded (locally only) from a model directory."""
    if preprocess is None or isinstance(preprocess, dict):
        got = "nothing" if preprocess is None else "an image preprocessing config"
        raise TypeError(f"movies needs a tokenizer as preprocess= (a transformers tokenizer or a local model "
                        f"directory holding one), got {got}")
    if isinstance(preprocess, (str, Path)):
        from transformers import AutoTokenizer

        folder = Path(preprocess)
        if not (folder / "tokenizer_config.json").is_file() and not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer in {preprocess} (expected tokenizer.json or tokenizer_config.json, "
                                    "as save_pretrained writes)")
        preprocess = AutoTokenizer.from_pretrained(str(preprocess), local_files_only=True)
    if not getattr(preprocess, "is_fast", False):
        raise TypeError(f"movies aligns word pieces with words through word_ids(), which needs a fast tokenizer; "
                        f"got {type(preprocess).__name__}")
    return preprocess


def _read_annotations(path: Path) -> list[dict[str, Any]]:
    annotations = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            evidences = [evidence for group in entry["evidences"] for evidence in group]
            annotations.append({
                "annotation_id": entry["annotation_id"],
                "classification": entry["classification"],
                "docid": evidences[0]["docid"] if evidences else entry["annotation_id"],
                "spans": [(int(e["start_token"]), int(e["end_token"])) for e in evidences],
            })
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise DatasetFormatError(path,
                                     f"line {number} is not an ERASER annotation ({type(error).__name__}: {error})",
                                     LAYOUT) from None
    return annotations


@register_dataset("movies")
class MovieReviews(DictDataset):
    """ERASER Movie Reviews: 1,600 / 200 / 200 reviews (train / val / test) labelled NEG or POS.

    Each review is read as ERASER stores it (``docs/<docid>``, words separated by whitespace; the
    evidences' ``start_token`` / ``end_token`` index these words) and tokenised word by word
    (``is_split_into_words``), truncated to ``max_length`` word pieces and padded to it, as Chefer et
    al.'s pipeline does (``max_length`` 512, truncation, labels ``["NEG", "POS"]`` -> 0, 1).

    Samples (collated into :class:`~vitexplain.metrics.EvalBatch` fields):

    * ``image``: the token ids [max_length] (long), padded with the tokenizer's pad token, which is
      what :func:`vitexplain.explain` treats as padding;
    * ``label``: the class (0 NEG, 1 POS, or as ``classes`` orders them); ``id``: the annotation id;
    * ``word_index``: the word alignment [max_length] (long): for each token the 1-based number of the
      review word it belongs to, 0 for special tokens and padding (words past the truncation have
      no token);
    * ``rationale_spans``: the human rationales [k, 2] (long) as word spans [start, end) over the whole
      review, all annotated evidences together.

    Args:
        root: see ``LAYOUT``.
        split: ``"test"`` (default, the protocol's), ``"val"`` or ``"train"``.
        preprocess: the tokenizer: a fast transformers tokenizer, or a local model directory holding
            one (``save_pretrained`` layout; never downloaded).
        max_length: word pieces kept per review, special tokens included (512 in Chefer et al.).
        classes: classification names in label order.
        n, seed, indices: serve a subset (see :func:`vitexplain.datasets.base.choose_indices`).
    """

    splits = ("test", "val", "train")
    provides = ("word_index", "rationale_spans")

    def __init__(self, root: str | Path, split: str = "test", *, preprocess: Any = None, max_length: int = 512,
                 classes: Sequence[str] = ("NEG", "POS"), n: int | None = None, seed: int = 0,
                 indices: Sequence[int] | str | Path | None = None):
        self.check_split(split)
        self.root = Path(root)
        listing = require(self.root / f"{split}.jsonl", LAYOUT, f"ERASER movies {split} annotations")
        self.docs = require(self.root / "docs", LAYOUT, "ERASER movies documents", directory=True)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
            raise ValueError(f"max_length must be an integer >= 3, got {max_length!r}")
        self.tokenizer = resolve_tokenizer(preprocess)
        self.max_length = max_length
        self.classes = tuple(classes)
        self.annotations = _read_annotations(listing)
        for entry in self.annotations:
            if entry["classification"] not in self.classes:
                raise DatasetFormatError(listing,
                                         f"{entry['annotation_id']} is classified {entry['classification']!r}, "
                                         f"not one of {self.classes}", LAYOUT)
        super().__init__(len(self.annotations), n, seed, indices)

    def load(self, item: int) -> dict[str, Any]:
        entry = self.annotations[item]
        path = self.docs / entry["docid"]
        if not path.is_file():
            raise DatasetNotFoundError(path, LAYOUT, f"document of {entry['annotation_id']}")
        words = path.read_text().split()
        if not words:
            raise DatasetFormatError(path, "the document has no words", LAYOUT)
        encoding = self.tokenizer(words, is_split_into_words=True, truncation=True, max_length=self.max_length,
                                  padding="max_length")
        word_numbers = [0 if word is None else word + 1 for word in encoding.word_ids()]
        spans = torch.tensor(entry["spans"], dtype=torch.long).reshape(-1, 2)
        return {
            "image": torch.tensor(encoding["input_ids"], dtype=torch.long),
            "label": self.classes.index(entry["classification"]),
            "id": entry["annotation_id"],
            "word_index": torch.tensor(word_numbers, dtype=torch.long),
            "rationale_spans": spans,
        }

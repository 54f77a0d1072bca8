"""Explaining image files batch by batch: for their classes (:func:`explain_files`, what ``vitexplain explain``
runs) or for their similarity to texts on a two-tower model (:func:`explain_files_with_texts`, its ``--text``).

Files are read only when their batch comes (:func:`vitexplain.image_files.read_batches`), so memory follows the
batch size, not the number of files. An unreadable file, or a method failing on a batch, is told to ``on_error``
and the rest goes on.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .image_files import ImageBatch, read_batches
from .maps import NonFiniteMapError
from .options import PositiveInt, check_options

#: reports one method's batch done: (files it took, method)
Progress = Callable[[int, str], None]


@dataclass
class ExplainedImage:
    """One image file explained: its maps by method ([h, w], on the CPU), the model's class probabilities,
    its prediction and the class explained."""

    name: str
    shown: np.ndarray
    maps: dict[str, torch.Tensor]
    probabilities: torch.Tensor
    predicted: int
    target: int


@dataclass
class ExplainedImageTexts:
    """One image file explained against texts: its maps by method ([T, h, w] on the CPU, row t that of text t)
    and the cosine of its image embedding to each text's embedding [T]."""

    name: str
    shown: np.ndarray
    maps: dict[str, torch.Tensor]
    cosines: torch.Tensor


def explain_files(model: torch.nn.Module, files: Sequence[str | Path], methods: Sequence[str], *, config: dict,
                  target: int | None = None, classes: bool | None = None, options: dict[str, dict] | None = None,
                  batch_size: PositiveInt = 16, on_error: Callable[[str], None] | None = None,
                  on_progress: Progress | None = None) -> Iterator[ExplainedImage]:
    """Explain image files with several methods, batch by batch, on the model's device.

    ``config`` is the model's data config (:func:`vitexplain.models.data_config`: its resize, crop and
    normalisation); ``target`` a class for every image (None: each image's prediction); ``classes`` as in
    :func:`vitexplain.explain` (True: the outputs are classes, whatever the head looks like); ``options``
    each method's options. An unreadable file or a method failing on a batch is told to ``on_error`` (default: a
    warning) and the others go on; so is a map holding NaN or infinite values, for its image and method alone
    (refused as :func:`vitexplain.explain` and the bench refuse it). ``on_progress(images, method)`` is called
    after each method's batch. Yields one :class:`ExplainedImage` per readable file, in order.

    ``batch_size`` not a positive integer, or ``target`` not an integer, is refused before any file is read; a
    ``target`` outside the model's classes at the first batch, before any file is explained (one ValueError).
    """
    from .api import explain
    from .instrumentation import adapter_for
    from .registry import get_method

    check_options("explain_files", explain_files, {"batch_size": batch_size, "target": target})
    on_error = on_error or _warn
    bound = {method: get_method(method).bind((options or {}).get(method)) for method in methods}   # checked once
    for taken, batch in _readable_batches(model, files, methods, config, batch_size, on_error, on_progress):
        probabilities = adapter_for(model).logits(batch.images).softmax(-1).cpu()  # a transformers output's logits
        if target is not None and not 0 <= target < probabilities.shape[-1]:
            raise ValueError(f"target {target} is not a class of this model (it has {probabilities.shape[-1]} "
                             f"classes, 0 to {probabilities.shape[-1] - 1})")
        predicted = probabilities.argmax(-1)
        targets = predicted if target is None else torch.full_like(predicted, target)
        maps = _every_method(methods, batch, taken, on_error, on_progress, lambda method: explain(
            model, batch.images, bound[method], target=targets.to(batch.images.device), classes=classes))
        for i, name in enumerate(batch.names):
            yield ExplainedImage(name, batch.shown[i], {method: found[i] for method, found in maps.items()
                                                        if i in found},
                                 probabilities[i], int(predicted[i]), int(targets[i]))


def explain_files_with_texts(model: torch.nn.Module, files: Sequence[str | Path], methods: Sequence[str],
                             texts: Sequence[str], *, config: dict, options: dict[str, dict] | None = None,
                             batch_size: PositiveInt = 16, on_error: Callable[[str], None] | None = None,
                             on_progress: Progress | None = None) -> Iterator[ExplainedImageTexts]:
    """Explain each image file's similarity to each text (a CLIP / SigLIP two-tower model), batch by batch.

    Every method's maps come from :func:`vitexplain.explain_texts` (each image repeated once per text, so memory
    grows with ``batch_size`` × texts); the cosines are those of the image and text embeddings, the score the maps
    explain. ``config``, ``options``, ``on_error`` and ``on_progress`` as in :func:`explain_files`. Yields one
    :class:`ExplainedImageTexts` per readable file, in order.
    """
    import torch.nn.functional as F

    from .instrumentation import adapter_for
    from .text_prompts import explain_texts, text_embeddings

    check_options("explain_files_with_texts", explain_files_with_texts, {"batch_size": batch_size})
    on_error = on_error or _warn
    options = options or {}
    for taken, batch in _readable_batches(model, files, methods, config, batch_size, on_error, on_progress):
        with torch.no_grad():
            cosines = F.cosine_similarity(adapter_for(model).forward(batch.images)[:, None],
                                          text_embeddings(model, texts)[None], dim=-1).cpu()
        maps = _every_method(methods, batch, taken, on_error, on_progress, lambda method: explain_texts(
            model, batch.images, texts, method, **options.get(method, {})), per_image=len(texts))
        for i, name in enumerate(batch.names):
            yield ExplainedImageTexts(name, batch.shown[i], {method: found[i] for method, found in maps.items()
                                                             if i in found}, cosines[i])


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=4)


def _readable_batches(model: torch.nn.Module, files: Sequence[str | Path], methods: Sequence[str], config: dict,
                      batch_size: int, on_error: Callable[[str], None],
                      on_progress: Progress | None) -> Iterator[tuple[int, ImageBatch]]:
    """(files taken, batch) of every batch with a readable file, on the model's device; a batch of none still
    counts as done for every method."""
    device = next(model.parameters()).device
    for taken, batch in read_batches(files, config, batch_size, device, on_error):
        if batch is not None:
            yield taken, batch
        elif on_progress is not None:
            for method in methods:
                on_progress(taken, method)


def _every_method(methods: Sequence[str], batch: ImageBatch, taken: int, on_error: Callable[[str], None],
                  on_progress: Progress | None, run: Callable[[str], torch.Tensor],
                  per_image: int | None = None) -> dict[str, dict[int, torch.Tensor]]:
    """Each method's maps of the batch by image row (``run(method)``, on the CPU); one that fails is told to
    ``on_error`` and left out, so it does not lose the others. A map holding NaN or infinite values loses its image
    alone (one ``on_error`` line each); ``per_image``: maps per image, rows of ``run``'s refused batch (its texts)."""
    maps = {}
    for method in methods:
        try:
            maps[method] = dict(enumerate(run(method).cpu()))
        except NonFiniteMapError as error:  # the maps of the other images are good
            found = error.maps.cpu()
            found = found if per_image is None else found.reshape(len(batch.names), per_image, *found.shape[1:])
            bad = sorted({row // (per_image or 1) for row in error.rows})
            for row in bad:
                on_error(f"method {method} on {batch.names[row]}: its map contains NaN or infinite values")
            maps[method] = {row: found[row] for row in range(len(batch.names)) if row not in bad}
        except Exception as error:  # noqa: BLE001 - one failing method must not lose the others
            on_error(f"method {method} on {', '.join(batch.names)}: {error}")
        if on_progress is not None:
            on_progress(taken, method)
    return maps

"""What the benchmark scripts share: random-weight timm models, the families compared, the reference pass,
timing on a shared machine, floating-point operation counts and a line describing the machine.

Not a test module and not part of the package: the scripts beside it import it by name.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping

import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

#: ViT-B-sized models of each family vitexplain describes, all with 196 patches (EVA-02's 14 px patches at
#: 196 px), plain ViT first: the families' ratios are compared with its ratios. Label -> (timm name, options).
FAMILIES = {
    "ViT": ("vit_base_patch16_224", {}),
    "ViT avg-pool": ("vit_base_patch16_gap_224", {}),
    "ViT MAP (SigLIP)": ("vit_base_patch16_siglip_224", {}),
    "EVA-02": ("eva02_base_patch14_224", {"img_size": 196}),
    "RoPE ViT": ("vit_base_patch16_rope_224", {}),
    "BEiT": ("beit_base_patch16_224", {}),
    "ViT relpos": ("vit_relpos_base_patch16_224", {}),
}

#: targets of issue 13 (and the earlier ones for the attention methods): method time / one forward+backward
TIME_TARGETS = {"raw_attention": 1.3, "rollout": 1.3, "attn_gradcam": 1.3, "gae": 1.3, "gradtoken": 1.5,
                "tokentm": 1.5, "transformer_attribution": 2.0, "legrad": 1.5, "attnlrp": 1.5, "cp_lrp": 1.5}
#: at batch 1, per image
BATCH1_TIME_TARGETS = {"gae": 1.5, "transformer_attribution": 1.5}
#: peak memory of a single-pass method / that of one forward+backward
MEMORY_TARGET = 1.5
#: a family's ratio within this share of plain ViT's
FAMILY_TOLERANCE = 0.2


def build_model(name: str, *, img_size: int | None = None, device: str | torch.device = "cpu",
                **options) -> torch.nn.Module:
    """A timm model with random weights (nothing downloaded), 1,000 classes, in eval mode, parameters frozen
    (as a user explaining a trained model has them); ``options`` go to its constructor."""
    torch.manual_seed(0)
    options = {"pretrained": False, "num_classes": 1000, **options}
    if img_size is not None:
        options["img_size"] = img_size
    model = timm.create_model(name, **options).to(device).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def image_batch(model: torch.nn.Module, batch: int, device: str | torch.device = "cpu") -> torch.Tensor:
    size = model.patch_embed.img_size
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(1)).to(device)


def forward_backward(model: torch.nn.Module, images: torch.Tensor, parameters: bool = False) -> Callable[[], None]:
    """The reference: one forward and one backward of the summed predicted-class logits, to the images, or
    (``parameters``) to the parameters as a training step does."""
    def run() -> None:
        x = images.detach().requires_grad_(not parameters)
        with torch.enable_grad():
            for parameter in model.parameters():
                parameter.requires_grad_(parameters)
            logits = model(x)
            logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
            for parameter in model.parameters():
                parameter.requires_grad_(False)
                parameter.grad = None
    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` runs after one warm-up run."""
    return statistics.median(interleaved({"fn": fn}, device, repeats)["fn"])


def interleaved(cases: Mapping[str, Callable[[], object]], device: torch.device,
                repeats: int) -> dict[str, list[float]]:
    """Seconds of each case in each of ``repeats`` rounds, after one warm-up round.

    Every round runs every case once, starting one case later than the round before, so that a slow
    spell of a shared machine falls on different cases; compare cases round by round (:func:`ratios`).
    """
    names = list(cases)
    for name in names:
        cases[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            _sync(device)
            start = time.perf_counter()
            cases[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def ratios(times: list[float], reference: list[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of the round-by-round ratios time / reference time."""
    found = [t / r for t, r in zip(times, reference)]
    return statistics.median(found), min(found), max(found)


def _sdpa_flops(query_shape, key_shape, backward: bool) -> int:
    """q kᵀ and A v of a fused attention (4 B H N M D), twice as much again for its backward."""
    *batch, tokens, width = query_shape
    keys = key_shape[-2]
    count = 4 * tokens * keys * width
    for size in batch:
        count *= size
    return 2 * count if backward else count


class FlopCounter(TorchDispatchMode):
    """Counts the floating-point operations of matrix products, convolutions and fused attention
    (PyTorch's own formulas, plus its CPU fused attention), forward and backward; element-wise work is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in flop_registry:
            self.total += flop_registry[packet](*args, **kwargs, out_val=out)
        elif packet is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
            self.total += _sdpa_flops(args[0].shape, args[1].shape, backward=False)
        elif packet is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
            self.total += _sdpa_flops(args[1].shape, args[2].shape, backward=True)
        return out


def flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of one run of ``fn`` (see :class:`FlopCounter`)."""
    with FlopCounter() as counter:
        fn()
    return counter.total


def describe_machine(device: torch.device) -> str:
    """The device, threads, load average and library versions, for the line above a table."""
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = (f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, "
                 f"{torch.get_num_threads()} threads")
    load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return f"{where}; {load}; torch {torch.__version__}, timm {timm.__version__}"


def pearson(maps: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Pearson r of each map [B, ...] with its reference, in float64 (1 where both are the same constant)."""
    a, b = (m.flatten(1).double().cpu() for m in (maps, reference))
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    norms = a.norm(dim=1) * b.norm(dim=1)
    same = (a - b).abs().amax(1) == 0
    return torch.where(same, torch.ones_like(norms), (a * b).sum(1) / norms.clamp(min=1e-300))

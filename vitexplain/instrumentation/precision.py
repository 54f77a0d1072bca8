"""Explanations computed in float32 with full-precision matrix products, whatever precision the caller runs in.

Users run models under autocast, with TF32 matrix products, or with bfloat16 / float16 weights. An
explanation's own arithmetic — LRP rules and their denominators, attention products, rollouts,
normalisations — loses the map in those precisions (a relevance denominator near zero changes sign,
a product of twelve rounded matrices drifts), so :func:`float32_scope` gives it float32:

* autocast is switched off on every device type;
* TF32 (and oneDNN's reduced-precision) float32 matrix products and convolutions are switched off;
* parameters and buffers held in a lower precision are seen in float32 (copies made once per scope,
  swapped in as each tensor's ``.data``; the model's own tensors come back untouched).

Forwards that only *score* inputs — RISE's, TIS's and ViT-CX's masked images, a metric's perturbed
copies — may run in the caller's precision, which is where the speed of a reduced precision is:
:func:`caller_precision` puts back, for the length of such a forward, what the caller had set up.
Everything that reads gradients or internals (every recording, every LRP pass) runs in float32.

Every global flag comes back exactly as it was, also when an exception is raised; scopes nest (an
inner one is given the outer :class:`Scope` and reuses its record of the caller's precision). A scope is an
object its user holds and passes on (:meth:`~vitexplain.instrumentation.ModelAdapter.call` keeps it on its
:class:`~vitexplain.instrumentation.adapter.Call`), not a context variable. ``docs/decisions/precision.md``
says why this split, and what each method measured.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..options import PRECISIONS

#: device types whose autocast state is kept and switched off
_AUTOCAST_DEVICES = ("cpu", "cuda")
#: dtypes below float32 that are seen in float32 within a scope
LOW_PRECISION = (torch.float16, torch.bfloat16)


# -- matrix-product precision flags ------------------------------------------------------------
#: the legacy switches: (getter, setter, full-precision value, TF32 value, the newer switches it stands for)
_LEGACY_FLAGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None], Any, Any, tuple[tuple[str, str], ...]]] = {
    "cublas_tf32": (torch._C._get_cublas_allow_tf32, torch._C._set_cublas_allow_tf32, False, True,
                    (("cuda", "matmul"),)),
    "cudnn_tf32": (torch._C._get_cudnn_allow_tf32, torch._C._set_cudnn_allow_tf32, False, True,
                   (("cuda", "conv"), ("cuda", "rnn"))),
    "float32_matmul_precision": (torch._C._get_float32_matmul_precision, torch._C._set_float32_matmul_precision,
                                 "highest", "high", (("cuda", "matmul"), ("mkldnn", "matmul"))),
}
#: the per-backend, per-operation precisions of torch >= 2.9 (``torch.backends.*.fp32_precision``)
_PRECISION_KEYS = (("generic", "all"), ("cuda", "all"), ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"),
                   ("mkldnn", "all"), ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))
#: the newer switches that reach float32 matrix products
_MATMUL_KEYS = (("generic", "all"), ("cuda", "matmul"), ("mkldnn", "all"), ("mkldnn", "matmul"))
_HAS_PRECISION_API = hasattr(torch._C, "_get_fp32_precision_getter")
#: precisions of the newer switches that are below float32
_REDUCED = ("tf32", "bf16")


def _read(getter: Callable[[], Any]) -> Any:
    """A flag's value, or None where torch refuses to read it (its legacy and newer switches disagree)."""
    try:
        return getter()
    except RuntimeError:
        return None


@dataclass(frozen=True)
class MatmulFlags:
    """The float32 matrix-product and convolution precision switches of this process, as read at one time.

    ``legacy`` holds ``allow_tf32`` (cuBLAS, cuDNN) and ``float32_matmul_precision`` (None where torch
    refuses to read one because the newer switches were set to something it cannot express);
    ``precisions`` the newer per-backend ``fp32_precision`` strings (empty before torch 2.9).
    """

    legacy: dict[str, Any]
    precisions: dict[tuple[str, str], str]

    @classmethod
    def read(cls) -> MatmulFlags:
        legacy = {name: _read(getter) for name, (getter, *_) in _LEGACY_FLAGS.items()}
        precisions = ({key: torch._C._get_fp32_precision_getter(*key) for key in _PRECISION_KEYS}
                      if _HAS_PRECISION_API else {})
        return cls(legacy, precisions)

    @property
    def full_precision(self) -> bool:
        """Whether float32 products and convolutions run in full precision (no TF32, no bf16 on oneDNN)."""
        legacy_full = all(value in (None, full)
                          for (_, _, full, *_), value in zip(_LEGACY_FLAGS.values(), self.legacy.values()))
        return legacy_full and not any(value in _REDUCED for value in self.precisions.values())

    @property
    def tf32_matmuls(self) -> bool:
        """Whether float32 matrix products run in a reduced precision (what users switch on; cuDNN's TF32
        convolutions, on by default in PyTorch, are not counted)."""
        legacy = self.legacy["cublas_tf32"] or self.legacy["float32_matmul_precision"] not in (None, "highest")
        return bool(legacy) or any(self.precisions.get(key) in _REDUCED for key in _MATMUL_KEYS)

    @staticmethod
    def _switch(tf32: bool) -> None:
        """Every switch to full precision or to TF32, through the switches the caller used: a legacy one where
        torch reads it back, else the newer ones it stands for (so a mixture stays the caller's kind)."""
        readable = [_read(getter) is not None for getter, *_ in _LEGACY_FLAGS.values()]  # before any switch moves
        for (_, setter, full, reduced, keys), legacy in zip(_LEGACY_FLAGS.values(), readable):
            if legacy:
                setter(reduced if tf32 else full)
            elif _HAS_PRECISION_API:
                for key in keys:
                    torch._C._set_fp32_precision_setter(*key, "tf32" if tf32 else "ieee")

    @classmethod
    def set_full_precision(cls) -> None:
        """Switch every float32 product and convolution to full precision (any newer switch still reduced too)."""
        cls._switch(tf32=False)
        if _HAS_PRECISION_API:
            for key in _PRECISION_KEYS:
                if torch._C._get_fp32_precision_getter(*key) in _REDUCED:
                    torch._C._set_fp32_precision_setter(*key, "ieee")

    @classmethod
    def set_tf32(cls) -> None:
        """Switch TF32 on for float32 matrix products and cuDNN convolutions, as
        ``torch.set_float32_matmul_precision("high")`` and ``torch.backends.cudnn.allow_tf32 = True`` do."""
        cls._switch(tf32=True)

    def restore(self) -> None:
        """Put every switch back to what it was when read (legacy ones first: they also move the newer ones)."""
        for name, (_, setter, *_) in _LEGACY_FLAGS.items():
            if self.legacy[name] is not None:
                setter(self.legacy[name])
        for key, value in self.precisions.items():
            if torch._C._get_fp32_precision_getter(*key) != value:
                torch._C._set_fp32_precision_setter(*key, value)


@contextlib.contextmanager
def full_precision_matmuls() -> Iterator[None]:
    """Within the block, float32 matrix products and convolutions run without TF32; the flags come back after."""
    flags = MatmulFlags.read()
    MatmulFlags.set_full_precision()
    try:
        yield
    finally:
        flags.restore()


# -- autocast -----------------------------------------------------------------------------------
def _autocast_state() -> dict[str, tuple[bool, torch.dtype]]:
    """Per device type, whether autocast is on and its dtype."""
    return {device: (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
            for device in _AUTOCAST_DEVICES}


@contextlib.contextmanager
def _autocast(state: dict[str, tuple[bool, torch.dtype]]) -> Iterator[None]:
    """Within the block, autocast on or off per device type as ``state`` says."""
    with contextlib.ExitStack() as stack:
        for device, (enabled, dtype) in state.items():
            stack.enter_context(torch.autocast(device_type=device, dtype=dtype, enabled=enabled))
        yield


# -- the scopes -----------------------------------------------------------------------------------
@dataclass
class Scope:
    """One :func:`float32_scope`: the caller's precision, and the model's low-precision tensors with their float32
    copies."""

    caller_autocast: dict[str, tuple[bool, torch.dtype]]
    caller_flags: MatmulFlags
    #: (tensor, its own data, its float32 copy), for every low-precision parameter and buffer
    tensors: list[tuple[Tensor, Tensor, Tensor]] = field(default_factory=list)

    def weights(self, float32: bool) -> None:
        for tensor, own, copy in self.tensors:
            tensor.data = copy if float32 else own


def _low_precision_tensors(model: nn.Module) -> list[Tensor]:
    return [tensor for tensor in (*model.parameters(), *model.buffers()) if tensor.dtype in LOW_PRECISION]


@contextlib.contextmanager
def float32_scope(model: nn.Module | None = None, outer: Scope | None = None) -> Iterator[Scope]:
    """Within the block: autocast off, float32 products in full precision, ``model``'s low-precision
    parameters and buffers seen in float32; everything comes back on exit, also after an exception.
    Yields the :class:`Scope`, which :func:`caller_precision` and :func:`precision_modes` take.

    A scope within ``outer`` reuses its record of the caller's precision (and its float32 copies): it is ``outer``
    itself when ``model`` has no low-precision tensor left.
    """
    low = [] if model is None else _low_precision_tensors(model)  # a model an outer scope holds is float32 already
    if outer is not None and not low:
        yield outer
        return
    scope = Scope(outer.caller_autocast if outer else _autocast_state(),
                  outer.caller_flags if outer else MatmulFlags.read(),
                  [(tensor, tensor.data, tensor.data.float()) for tensor in low])
    with _autocast({device: (False, dtype) for device, (_, dtype) in scope.caller_autocast.items()}), \
            full_precision_matmuls():
        scope.weights(float32=True)
        try:
            yield scope
        finally:
            scope.weights(float32=False)


@contextlib.contextmanager
def caller_precision(scope: Scope | None) -> Iterator[None]:
    """Within the :func:`float32_scope` ``scope``, a forward that only scores inputs runs in the caller's precision:
    its autocast, its matrix-product flags, the model's own low-precision weights. Without a scope (None): nothing
    changes.

    The forward must not be differentiated after the block (its weights are swapped back on exit).
    """
    if scope is None:
        yield
        return
    inside = MatmulFlags.read()
    scope.caller_flags.restore()
    scope.weights(float32=False)
    try:
        with _autocast(scope.caller_autocast):
            yield
    finally:
        scope.weights(float32=True)
        inside.restore()


def precision_modes(model: nn.Module, scope: Scope | None = None) -> list[str]:
    """The reduced precisions the caller runs ``model`` in, by name: ``"bfloat16 weights"``, ``"float16
    weights"``, ``"<device> autocast <dtype>"`` (e.g. ``"cuda autocast bfloat16"``), ``"tf32"`` (TF32 matrix
    products); [] in float32 (PyTorch's default TF32 cuDNN convolutions included).
    Within a :func:`float32_scope`, given its ``scope``: the caller's."""
    autocast = scope.caller_autocast if scope else _autocast_state()
    flags = scope.caller_flags if scope else MatmulFlags.read()
    dtypes = {tensor.dtype for tensor in _low_precision_tensors(model)} | (
        {own.dtype for _, own, _ in scope.tensors} if scope else set())
    modes = [f"{str(dtype).removeprefix('torch.')} weights" for dtype in LOW_PRECISION if dtype in dtypes]
    modes += [f"{device} autocast {str(dtype).removeprefix('torch.')}" for device, (enabled, dtype) in autocast.items()
              if enabled]
    return modes + (["tf32"] if flags.tf32_matmuls else [])


# -- running in a user's precision ---------------------------------------------------------------

@contextlib.contextmanager
def precision_mode(name: str, device: torch.device | str) -> Iterator[None]:
    """Within the block, models run as a user running in ``name`` has them: ``tf32`` switches TF32 float32
    products and convolutions on, ``bfloat16`` / ``float16`` autocast on ``device``'s type, ``float32``
    changes nothing. Every flag comes back on exit. Explanations still compute in float32 (:func:`float32_scope`)."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    device_type = torch.device(device).type
    if name in ("bfloat16", "float16"):
        with torch.autocast(device_type=device_type, dtype=getattr(torch, name)):
            yield
        return
    flags = MatmulFlags.read()
    if name == "tf32":
        MatmulFlags.set_tf32()
    try:
        yield
    finally:
        flags.restore()

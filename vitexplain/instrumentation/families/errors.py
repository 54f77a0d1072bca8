"""The one error of model support, raised where a family or a part of one cannot serve a model."""


class UnsupportedModelError(TypeError):
    """The model is not one vitexplain can instrument, or lacks what a method needs."""

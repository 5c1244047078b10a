"""The errors of the Horovod alias: each names the Horovod feature a script asked for, and what hpcring
offers instead."""

from __future__ import annotations


class HorovodFeatureMissing(AttributeError):
    """A Horovod name hpcring does not provide (an AttributeError, so `hasattr` and `getattr(m, n, default)`
    behave as they do for any missing attribute)."""


class HorovodNameUnavailable(ImportError):
    """`from horovod.x import name` (or `import horovod.x.name`) for a Horovod name hpcring does not provide:
    the message is `HorovodFeatureMissing`'s (`modules.py` says why it is an ImportError here)."""


class HorovodFrameworkUnavailable(ImportError):
    """A Horovod package for a framework hpcring does not support (TensorFlow, Keras, MXNet, Spark)."""


DOCS = "docs/guide/torch.md, 'Running Horovod scripts unchanged'"


def feature_missing(module: str, name: str, alternative: str | None) -> HorovodFeatureMissing:
    """The error for `module.name`, with a specific alternative when one is known."""
    instead = alternative or f"what hpcring's {module} provides is listed in {DOCS}"
    return HorovodFeatureMissing(f"Horovod's {module}.{name} is not provided by hpcring; {instead}")

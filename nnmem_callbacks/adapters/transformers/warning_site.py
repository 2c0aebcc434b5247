"""Warnings of the Hugging Face adapter, shown at the user's line (``trainer.train()``, ``plan_training_arguments(...)``).

A callback's warning is raised several frames below the user's code: inside
this package, the Trainer's callback handler (``trainer_callback.py``, whose
``result = getattr(callback, event)(`` the warning would otherwise echo), its
training loop and accelerate's wrappers. :func:`warn` points the warning at
the first frame outside those packages (:mod:`nnmem_callbacks.core.warning_site`).

Example:
    >>> _internal("transformers.trainer_callback"), _internal("nnmem_callbacks.transformers"), _internal("__main__")
    (True, True, False)
"""

from __future__ import annotations

from nnmem_callbacks.core import warning_site

__all__ = ["INTERNAL_PACKAGES", "warn"]

#: Packages whose frames lie between the user's call and the warning (``contextlib``: decorators made with it).
INTERNAL_PACKAGES = ("nnmem_callbacks", "transformers", "accelerate", "trl", "peft", "contextlib", "functools")


def _internal(module: str) -> bool:
    return warning_site.internal(module, INTERNAL_PACKAGES)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` shown at the first frame outside this package, transformers and
    accelerate: the user's ``trainer.train()`` or ``plan_training_arguments(...)`` line."""
    warning_site.warn(message, INTERNAL_PACKAGES, category)

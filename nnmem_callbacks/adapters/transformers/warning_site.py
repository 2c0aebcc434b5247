"""Warnings of the Hugging Face adapter, shown at the user's line (``trainer.train()``, ``plan_training_arguments(...)``).

A callback's warning is raised several frames below the user's code: inside
this package, the Trainer's callback handler (``trainer_callback.py``, whose
``result = getattr(callback, event)(`` the warning would otherwise echo), its
training loop and accelerate's wrappers. :func:`warn` points the warning at
the first frame outside those packages, so the location it shows is the line
that started training.

Example:
    >>> _internal("transformers.trainer_callback"), _internal("nnmem_callbacks.transformers"), _internal("__main__")
    (True, True, False)

Known limitations:
    * Frames are told apart by their module's name (``__name__`` of the
      frame's globals); a user module named like one of
      :data:`INTERNAL_PACKAGES` is skipped as well.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["INTERNAL_PACKAGES", "user_stacklevel", "warn"]

#: Packages whose frames lie between the user's call and the warning (``contextlib``: decorators made with it).
INTERNAL_PACKAGES = ("nnmem_callbacks", "transformers", "accelerate", "trl", "peft", "contextlib", "functools")


def _internal(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in INTERNAL_PACKAGES)


def user_stacklevel(skip: int = 1) -> int:
    """How many frames up from the frame ``skip`` above this call (that frame: 1) the first frame outside
    :data:`INTERNAL_PACKAGES` is; 1 when every frame is internal."""
    frame = sys._getframe(skip + 1)
    level = 1
    while frame is not None:
        if not _internal(str(frame.f_globals.get("__name__", ""))):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` shown at the first frame outside this package, transformers and
    accelerate: the user's ``trainer.train()`` or ``plan_training_arguments(...)`` line."""
    warnings.warn(message, category, stacklevel=user_stacklevel() + 1)

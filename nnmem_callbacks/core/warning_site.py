"""Warnings shown at the user's line: the first frame outside the libraries between the user's call and the warning.

An adapter's warning is raised several frames below the user's code (inside this package, the framework's callback
handler and training loop): with a fixed ``stacklevel`` the location it shows is a library line. :func:`warn` points
it at the first frame whose module is not one of the given packages, such as the user's ``trainer.fit(...)``.

Example:
    >>> internal("transformers.trainer_callback", ("transformers",)), internal("__main__", ("transformers",))
    (True, False)

Known limitations:
    * Frames are told apart by their module's name (``__name__`` of the frame's globals); a user module named like
      one of the packages is skipped as well.
"""

from __future__ import annotations

import sys
import warnings
from typing import Sequence

__all__ = ["internal", "user_stacklevel", "warn"]


def internal(module: str, packages: Sequence[str]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == name or module.startswith(name + ".") for name in packages)


def user_stacklevel(packages: Sequence[str], skip: int = 1) -> int:
    """How many frames up from the frame ``skip`` above this call (that frame: 1) the first frame outside
    ``packages`` is; 1 when every frame is inside them."""
    frame = sys._getframe(skip + 1)
    level = 1
    while frame is not None:
        if not internal(str(frame.f_globals.get("__name__", "")), packages):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def warn(message: str, packages: Sequence[str], category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` shown at the first frame outside ``packages`` (and this package)."""
    warnings.warn(message, category, stacklevel=user_stacklevel(("nnmem_callbacks", *packages)) + 1)

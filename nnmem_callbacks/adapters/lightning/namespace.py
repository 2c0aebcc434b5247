"""How the Lightning ``MemoryBudgetCallback`` reaches Lightning: one ``Namespace`` per Lightning package.

Lightning ships as ``pytorch_lightning`` and as ``lightning.pytorch``, and a
Trainer of one rejects callbacks built on the other. The callback's modules
therefore reach Lightning only through the :class:`Namespace` the concrete
callback class was built on: the root package and the few utilities used
(rank-zero messages, ``lightning_setattr`` and friends, ``isolate_rng``,
``TensorBoardLogger``).

Example:
    >>> Namespace("pytorch_lightning").lightning_setattr.__module__
    'pytorch_lightning.utilities.parsing'
"""

from __future__ import annotations

import importlib

from nnmem_callbacks.core import warning_site

__all__ = ["Namespace"]

#: Packages whose frames a warning skips to point at the user's code (the callback, Lightning, their helpers).
_LIBRARY_PACKAGES = (
    "nnmem_callbacks",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning_utilities",
    "torch",
    "contextlib",
)

_INSTALL_HINT = {
    "pytorch_lightning": "pip install 'nnmem_callbacks[lightning]' (or pip install pytorch-lightning)",
    "lightning.pytorch": "pip install lightning",
}


class Namespace:
    """The Lightning package a callback class is built on, and the utilities it uses.

    Args:
        root: ``"pytorch_lightning"`` or ``"lightning.pytorch"``.

    Raises:
        ImportError: When the package is missing, with an install hint and the
            name of the module to use for the other namespace.
    """

    def __init__(self, root: str) -> None:
        try:
            self.pl = importlib.import_module(root)
        except ImportError as error:
            other = "nnmem_callbacks.lightning_pytorch" if root == "pytorch_lightning" else "nnmem_callbacks.lightning"
            raise ImportError(
                f"{root} is not installed ({error}). Install it with: {_INSTALL_HINT.get(root, 'pip install ' + root)}. "
                f"If you use the other Lightning namespace, import MemoryBudgetCallback from {other} instead."
            ) from error
        self.root = root
        rank_zero = importlib.import_module(f"{root}.utilities.rank_zero")
        parsing = importlib.import_module(f"{root}.utilities.parsing")
        seed = importlib.import_module(f"{root}.utilities.seed")
        self.Callback = self.pl.Callback
        self.rank_zero_warn = rank_zero.rank_zero_warn
        self.rank_zero_info = rank_zero.rank_zero_info
        self._rank_zero_only = rank_zero.rank_zero_only
        self.lightning_hasattr = parsing.lightning_hasattr
        self.lightning_getattr = parsing.lightning_getattr
        self.lightning_setattr = parsing.lightning_setattr
        self.isolate_rng = seed.isolate_rng
        self.TensorBoardLogger = importlib.import_module(f"{root}.loggers").TensorBoardLogger

    def user_warn(self, message: str) -> None:
        """Warns ``message`` on global rank zero, at the first frame of the user's code (``trainer.fit(...)``).

        ``rank_zero_warn`` takes a fixed ``stacklevel``, which lands in this package or in Lightning: the
        warning would name a library line instead of the call that started the run.
        """
        if getattr(self._rank_zero_only, "rank", 0) == 0:
            warning_site.warn(message, _LIBRARY_PACKAGES)

"""``python -m nnmem_callbacks.cli``: the ``nnmem`` command."""

import sys

from nnmem_callbacks.cli import main

if __name__ == "__main__":
    sys.exit(main())

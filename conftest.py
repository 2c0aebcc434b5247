"""Repository-wide pytest setup (tests/ and the package's doctests).

Kernel probes (:mod:`nnmem_callbacks.probes`) cache their measurements on disk:
the test-suite never writes to the real user cache directory. The variable is
set at import, so that doctests and child processes inherit it; tests needing
their own directory monkeypatch ``NNMEM_CACHE_DIR``.
"""

import atexit
import os
import shutil
import tempfile

os.environ["NNMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nnmem-test-cache-")
atexit.register(shutil.rmtree, os.environ["NNMEM_CACHE_DIR"], True)

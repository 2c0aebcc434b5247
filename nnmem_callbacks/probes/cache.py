"""An on-disk cache of kernel probes, one JSON file per kernel fingerprint.

The directory is ``$NNMEM_CACHE_DIR`` when set, else the user cache directory
(:func:`platformdirs.user_cache_dir`) plus ``probes``. Each file is named by
the device type and :func:`~nnmem_callbacks.probes.fingerprint.fingerprint_hash`,
so a new torch, oneDNN, instruction set or thread count starts a new file.

Writers are safe when concurrent: under a :class:`filelock.FileLock`, the file
on disk is read again, merged with the new entries, written to a temporary
file and moved into place with :func:`os.replace`. A file that cannot be read
(corrupt JSON, another fingerprint) is ignored with a warning naming it and is
rewritten by the next save.

Example:
    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> cache = ProbeCache({"device_type": "cpu", "torch": "x"}, directory)
    >>> cache.save({"op": {"points": [[1, 10], [2, 20]]}})
    >>> ProbeCache({"device_type": "cpu", "torch": "x"}, directory).load()["op"]["points"]
    [[1, 10], [2, 20]]
    >>> ProbeCache({"device_type": "cpu", "torch": "y"}, directory).load()
    {}
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from nnmem_callbacks.probes.fingerprint import fingerprint_hash

__all__ = ["cache_dir", "CACHE_DIR_ENV", "FORMAT_VERSION", "ProbeCache"]

#: environment variable overriding the cache directory
CACHE_DIR_ENV = "NNMEM_CACHE_DIR"

#: bumped when the entry format changes (older files are then ignored)
FORMAT_VERSION = 1


def cache_dir() -> Path:
    """The probe cache directory (``$NNMEM_CACHE_DIR`` or the user cache dir)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("nnmem_callbacks")) / "probes"


class ProbeCache:
    """The probe entries of one fingerprint, on disk.

    Args:
        fp: The kernel fingerprint (:func:`~nnmem_callbacks.probes.fingerprint.fingerprint`).
        directory: Where the file lives; default :func:`cache_dir`.
    """

    def __init__(self, fp: dict[str, Any], directory: str | os.PathLike | None = None) -> None:
        self.fingerprint = fp
        self.directory = Path(directory) if directory is not None else cache_dir()
        self.path = self.directory / f"{fp.get('device_type', 'any')}-{fingerprint_hash(fp)}.json"

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as error:
            warnings.warn(
                f"nnmem_callbacks: cannot read the probe cache file {self.path} ({error}); ignoring it", stacklevel=3
            )
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise ValueError("no 'entries' object")
            if data.get("version") != FORMAT_VERSION or data.get("fingerprint") != json.loads(
                json.dumps(self.fingerprint, default=str)
            ):
                raise ValueError("another format version or fingerprint")
        except ValueError as error:
            warnings.warn(
                f"nnmem_callbacks: ignoring the corrupt probe cache file {self.path} ({error}); it will be rewritten",
                stacklevel=3,
            )
            return {}
        return data["entries"]

    def load(self) -> dict[str, Any]:
        """The entries on disk (empty when there is no valid file)."""
        return self._read()

    def save(self, entries: dict[str, Any]) -> None:
        """Merges ``entries`` into the file (under a lock; atomic replace).

        An entry with ``points`` is merged point by point with the one on disk.
        """
        if not entries:
            return
        from filelock import FileLock

        self.directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            merged = self._read()
            for key, entry in entries.items():
                merged[key] = _merge_entry(merged.get(key), entry)
            data = {"version": FORMAT_VERSION, "fingerprint": self.fingerprint, "entries": merged}
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=self.path.name, suffix=".tmp")
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    json.dump(data, out, sort_keys=True, default=str)
                os.replace(temporary, self.path)
            except BaseException:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
                raise


def _merge_entry(old: Any, new: Any) -> Any:
    """Merges two entries: the union of their ``points`` (new values win).

    Example:
        >>> _merge_entry({"points": [[1, 5], [2, 9]]}, {"points": [[2, 10], [4, 20]], "linear": False})
        {'points': [[1, 5], [2, 10], [4, 20]], 'linear': False}
    """
    if not isinstance(old, dict) or not isinstance(new, dict) or "points" not in new or "points" not in old:
        return new
    points = {int(n): int(v) for n, v in old["points"]}
    points.update({int(n): int(v) for n, v in new["points"]})
    return {**old, **new, "points": [[n, points[n]] for n in sorted(points)]}

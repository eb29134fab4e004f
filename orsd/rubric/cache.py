"""On-disk cache of verifier answers, keyed by (model, messages, sampling parameters).

One JSON file per answer under `<cache_dir>/<2 hex>/<sha256>.json`, written atomically (temporary
file + rename), so a killed run never leaves a half-written entry and concurrent writers of the same
key are harmless. Only readable answers are stored; failures are always asked again. The API key
is not part of the key material and never written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def cache_key(model: str, messages: list[dict], params: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of what determines a temperature-0 answer."""
    material = json.dumps({"model": model, "messages": messages, "params": params},
                          sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class ResponseCache:
    """A directory of cached answers (`get`/`put` a JSON-serialisable dict by key)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"cache_dir={directory!r}: expected a directory path")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            with open(path, encoding="utf-8") as handle:
                value = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:  # a damaged entry is a miss, not a crash
            logger.warning("verifier cache entry %s unreadable (%s); asking again", path, error)
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(value, handle, ensure_ascii=False)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.directory.glob("*/*.json"))

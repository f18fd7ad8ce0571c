"""Short content hashes of JSON-able values (configuration hashes, cache keys)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(value: Any) -> str:
    """SHA-256 (first 16 hex digits) of ``value``'s canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

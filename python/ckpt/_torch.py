"""torch tensors of what ckpt read (``framework="pt"``), imported only when asked for.

A dtype torch lacks (safetensors' ``F6_E2M3``/``F6_E3M2``, ckpt's ``float6_e2m3fn_x4``/``float6_e3m2fn_x4``)
comes back as a ``uint8`` tensor of its bytes, the last dimension counting bytes.

A tensor that is a window of a ``.pt`` or ``.safetensors`` file's map is made over a copy-on-write map of
that file (``torch.UntypedStorage.from_file(shared=False)``, as safetensors does): no copy, and writable —
a write changes this process's pages, never the file. Any other tensor (a directory format's, a compressed
or gathered one) is copied into memory torch owns.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional, Sequence, Tuple


def identity(path: str) -> Optional[Tuple[int, int, int, int]]:
    """What tells one file from another at ``path``: device, inode, size, modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Converter:
    """Makes the torch tensors of one checkpoint (the extension calls it with each tensor's parts)."""

    def __init__(self, path: str, fmt: str, opened_as: Optional[Tuple[int, int, int, int]]) -> None:
        import torch  # noqa: PLC0415

        self.torch = torch
        self.path = path
        # Only single-file formats map the file at `path`; the file must be the one ckpt opened.
        self.mappable = fmt in ("torch", "safetensors") and opened_as is not None
        self.opened_as = opened_as
        self.storage: Any = None

    def _storage(self) -> Any:
        if self.storage is None and self.mappable:
            before = identity(self.path)
            storage = self.torch.UntypedStorage.from_file(self.path, shared=False, nbytes=before[2] if before else 0)
            if before != self.opened_as or identity(self.path) != self.opened_as:
                self.mappable = False  # the file at `path` changed since it was opened: copy instead
                return None
            self.storage = storage
        return self.storage

    def __call__(self, arr: Any, dtype: str, offset: Optional[int], shape: Sequence[int],
                 strides: Sequence[int], requires_grad: bool) -> Any:
        import numpy as np  # noqa: PLC0415

        torch = self.torch
        tdtype = getattr(torch, dtype, None)
        if tdtype is None:
            # A dtype torch lacks (safetensors' float6, four values in three bytes): its bytes, the last
            # dimension counting them.
            a = np.array(arr, copy=True, order="C").reshape(-1).view(np.uint8)
            rows = tuple(shape[:-1]) + ((shape[-1] if shape else 1) * arr.dtype.itemsize,)
            return torch.from_numpy(a).reshape(rows)
        size = tdtype.itemsize
        if offset is not None and offset % size == 0 and self.mappable:
            storage = self._storage()
            if storage is not None:
                t = torch.empty(0, dtype=tdtype).set_(storage, offset // size, tuple(shape), tuple(strides))
                return t.requires_grad_(requires_grad) if requires_grad else t
        a = arr if arr.flags.writeable and arr.flags.c_contiguous else np.array(arr, copy=True, order="C")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = torch.from_numpy(a.reshape(-1).view(np.uint8)).view(tdtype).reshape(tuple(shape))
        return t.requires_grad_(requires_grad) if requires_grad else t

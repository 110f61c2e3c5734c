"""``torch.distributed.checkpoint`` through ckpt: :class:`Reader`, a ``StorageReader`` for ``dcp.load``, and
:class:`Writer`, a ``StorageWriter`` for ``dcp.save`` from one process.

>>> import torch.distributed.checkpoint as dcp, ckpt.dcp
>>> dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("step-1000/"))

``dcp.load`` plans what each rank needs — its shard of each tensor, however the checkpoint was sharded when
it was saved (resharding) — and the reader copies those boxes straight from the checkpoint's memory maps into
the state dict's tensors, in parallel, with the GIL released: no ``torch.load`` of each item, no intermediate
copy. It reads every format ckpt reads, not only DCP: an hfai, PyTorch-BigGraph, RecIS, ``.pt`` or
safetensors checkpoint loads into a sharded model the same way (each tensor one chunk).

:class:`Writer` hands what ``dcp.save`` plans to ckpt's DCP writer (``ckpt.save(..., format="distcp")``):
durable (staged, fsync'd, swapped in whole; a crash leaves the old checkpoint or the new one) and loadable by
every torch from 2.0. It writes from one process (a job of several ranks saves with torch's own writer, or
gathers and calls ``ckpt.save(state_dict, path, format="distcp", world_size=N)``).

torch is imported when :class:`Reader` or :class:`Writer` is first used (``import ckpt`` never imports it).
"""

from __future__ import annotations

import io
import os
import uuid
from typing import TYPE_CHECKING, Any, List

__all__ = ["Reader", "Writer"]

if TYPE_CHECKING:  # what type checkers see; the class itself is made on first use (torch imported then)
    from torch.distributed.checkpoint import StorageReader

    class Reader(StorageReader):
        path: "str | None"

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *,
                     storage_options: "dict[str, str] | None" = None, **limits: Any) -> None: ...

    from torch.distributed.checkpoint import StorageWriter

    class Writer(StorageWriter):
        path: "str | None"

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *, dcp_profile: "str | None" = None,
                     storage_options: "dict[str, str] | None" = None) -> None: ...


def _reader_class() -> Any:
    import torch  # noqa: PLC0415
    from torch.distributed.checkpoint import StorageReader  # noqa: PLC0415
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,  # noqa: PLC0415
                                                       Metadata, StorageMeta, TensorProperties,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType  # noqa: PLC0415
    from torch.futures import Future  # noqa: PLC0415

    import ckpt  # noqa: PLC0415

    class Reader(StorageReader):
        """A ``torch.distributed.checkpoint.StorageReader`` that reads through ckpt.

        ``path``: the checkpoint (any format ckpt reads; ``dcp.load(..., checkpoint_id=...)`` may give it
        instead); an object-storage URL (``s3://bucket/step-100``) is fetched whole first, with
        ``storage_options`` (see ``ckpt.open``). ``limits``: ckpt's read limits (``ckpt.LIMITS``).

        >>> dcp.load(model_state, storage_reader=ckpt.dcp.Reader("checkpoint/"))
        """

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *,
                     storage_options: "dict[str, str] | None" = None, **limits: Any) -> None:
            super().__init__()
            self.path = None if path is None else os.fspath(path)
            self.storage_options = storage_options
            self.limits = limits
            self.load_id = str(uuid.uuid4())
            self._ck: Any = None
            self._dtypes: dict = {}

        # --- StorageReader ----------------------------------------------------------------------------
        def reset(self, checkpoint_id: "str | os.PathLike[str] | None" = None) -> None:
            if checkpoint_id is not None:
                self.path = os.fspath(checkpoint_id)
                self._ck = None
            self.load_id = str(uuid.uuid4())

        def _checkpoint(self) -> Any:
            if self._ck is None:
                if self.path is None:
                    raise ckpt.UsageError("ckpt.dcp.Reader: no checkpoint path (give one, or checkpoint_id)",
                                          fault="usage")
                self._ck = ckpt.open(self.path, storage_options=self.storage_options, **self.limits)
            return self._ck

        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rows, planner_data = self._checkpoint()._n().dcp_metadata()
            sd: dict = {}
            for fqn, kind, dtype, size, chunks in rows:
                if kind == "tensor":
                    sd[fqn] = TensorStorageMetadata(
                        properties=TensorProperties(dtype=getattr(torch, dtype)),
                        size=torch.Size(size),
                        chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in chunks],
                    )
                else:
                    sd[fqn] = BytesStorageMetadata()
            return Metadata(state_dict_metadata=sd, planner_data=planner_data, storage_data={},
                            storage_meta=StorageMeta(checkpoint_id=self.path, load_id=self.load_id))

        def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            # Every rank gets here, with the metadata the coordinator read: the dtypes of the tensors.
            self._dtypes = {k: v.properties.dtype for k, v in metadata.state_dict_metadata.items()
                            if isinstance(v, TensorStorageMetadata)}
            self._checkpoint()

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
            return plans

        def read_data(self, plan: Any, planner: Any) -> Future:
            native = self._checkpoint()._n()
            direct, targets, other = [], [], []
            for req in plan.items:
                fqn = req.storage_index.fqn
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(native.value_bytes(fqn)))
                    continue
                chunk = req.storage_index.offset or torch.Size([0] * len(req.lengths))
                offsets = [int(c) + int(s) for c, s in zip(chunk, req.storage_offsets)]
                target = planner.resolve_tensor(req).detach()
                # A CPU tensor of the checkpoint's dtype is written by ckpt directly; anything else (another
                # dtype, which copy_ casts; a GPU tensor) goes through a torch tensor of the box.
                if target.device.type == "cpu" and target.layout == torch.strided and not target.is_conj() \
                        and not target.is_neg() and min(target.stride(), default=0) >= 0 \
                        and target.dtype == self._dtypes.get(fqn):
                    storage = target.untyped_storage()
                    lo = storage.data_ptr()
                    direct.append((fqn, offsets, [int(x) for x in req.lengths], target.data_ptr(),
                                   list(target.stride()), target.element_size(), (lo, lo + storage.nbytes())))
                    targets.append((req, target))
                else:
                    other.append((req, target, offsets))
            # Every CPU destination at once, straight from the maps, in parallel (dtype checked by ckpt).
            native.read_into(direct)
            for req, target in targets:
                planner.commit_tensor(req, target)
            for req, target, offsets in other:  # a GPU or unusual destination: through a torch tensor
                src = self._checkpoint().region(fqn_of(req), offsets, [int(x) for x in req.lengths], "pt")
                target.copy_(src)
                planner.commit_tensor(req, target)
            fut: Future = Future()
            fut.set_result(None)
            return fut

        @property
        def checkpoint_id(self) -> "str | None":
            return self.path

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: "str | os.PathLike[str]") -> bool:
            try:
                ckpt._ckpt.detect(os.fspath(checkpoint_id))
            except Exception:  # noqa: BLE001
                return False
            return True

    return Reader


def _writer_class() -> Any:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.checkpoint import StorageWriter  # noqa: PLC0415
    from torch.distributed.checkpoint.planner import WriteItemType  # noqa: PLC0415
    from torch.distributed.checkpoint.storage import WriteResult  # noqa: PLC0415
    from torch.futures import Future  # noqa: PLC0415

    import ckpt  # noqa: PLC0415

    class Writer(StorageWriter):
        """A ``torch.distributed.checkpoint.StorageWriter`` that writes through ckpt, from one process.

        ``path``: the checkpoint directory (or ``dcp.save(..., checkpoint_id=...)``); ``dcp_profile``:
        ``"max-compat"`` (loads in torch 2.0 to 2.15, the default) or ``"torch213"`` (torch 2.13's layout).
        ``path`` may be an object-storage URL (``s3://bucket/step-100``): streamed to the bucket, with
        ``storage_options`` (see ``ckpt.save``).

        >>> dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("step-1000/"))
        """

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *, dcp_profile: "str | None" = None,
                     storage_options: "dict[str, str] | None" = None) -> None:
            super().__init__()
            self.path = None if path is None else os.fspath(path)
            self.dcp_profile = dcp_profile
            self.storage_options = storage_options
            self.save_id = str(uuid.uuid4())
            self._items: dict = {}

        def reset(self, checkpoint_id: "str | os.PathLike[str] | None" = None) -> None:
            if checkpoint_id is not None:
                self.path = os.fspath(checkpoint_id)
            self.save_id = str(uuid.uuid4())
            self._items = {}

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                raise ckpt.UsageError(
                    "ckpt.dcp.Writer writes from one process; this job has "
                    f"{dist.get_world_size()} ranks (save with torch's FileSystemWriter, or gather the state dict "
                    "and call ckpt.save(state_dict, path, format='distcp', world_size=N))", fault="usage")

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
            return plans

        def write_data(self, plan: Any, planner: Any) -> Future:
            results = []
            for item in plan.items:
                data = planner.resolve_data(item)
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    data.seek(0)
                    self._items[fqn] = torch.load(data, weights_only=False)
                    size = data.getbuffer().nbytes
                else:
                    t = data.detach()
                    whole = list(item.tensor_data.size)
                    if list(t.shape) != whole:
                        raise ckpt.UsageError(f"ckpt.dcp.Writer: {fqn} is a shard ({list(t.shape)} of {whole}); it "
                                              "writes whole tensors, from one process", fault="usage")
                    self._items[fqn] = t
                    size = t.numel() * t.element_size()
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=None))
            fut: Future = Future()
            fut.set_result(results)
            return fut

        def finish(self, metadata: Any, results: List[List[Any]]) -> None:
            if self.path is None:
                raise ckpt.UsageError("ckpt.dcp.Writer: no checkpoint path (give one, or checkpoint_id)",
                                      fault="usage")
            paths = metadata.planner_data or {}
            state: dict = {}
            for fqn, value in self._items.items():
                _set_element(state, tuple(paths.get(fqn, (fqn,))), value)
            ckpt.save(state, self.path, format="distcp", dcp_profile=self.dcp_profile,
                      storage_options=self.storage_options)
            self._items = {}

        def storage_meta(self) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta  # noqa: PLC0415

            return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

        @property
        def checkpoint_id(self) -> "str | None":
            return self.path

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: "str | os.PathLike[str]") -> bool:
            return isinstance(checkpoint_id, (str, os.PathLike))

    return Writer


def _set_element(root: dict, path: tuple, value: Any) -> None:
    """Puts ``value`` at ``path`` in ``root`` as DCP's ``set_element`` does: string keys make dicts, integer
    indices lists."""
    cur: Any = root
    for i, key in enumerate(path[:-1]):
        nxt = path[i + 1]
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(cur, list):
            while len(cur) <= key:
                cur.append(None)
            if cur[key] is None:
                cur[key] = empty
            cur = cur[key]
        else:
            cur = cur.setdefault(key, empty)
    last = path[-1]
    if isinstance(cur, list):
        while len(cur) <= last:
            cur.append(None)
    cur[last] = value


def fqn_of(req: Any) -> str:
    return req.storage_index.fqn


_classes: dict = {}


def __getattr__(name: str) -> Any:
    makers = {"Reader": _reader_class, "Writer": _writer_class}
    if name in makers:
        if name not in _classes:
            _classes[name] = makers[name]()
        return _classes[name]
    raise AttributeError(f"module 'ckpt.dcp' has no attribute {name!r}")

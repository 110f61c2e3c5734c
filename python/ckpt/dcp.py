"""``torch.distributed.checkpoint`` through ckpt: :class:`Reader`, a ``StorageReader`` for ``dcp.load``, and
:class:`Writer`, a ``StorageWriter`` for ``dcp.save`` from one process.

>>> import torch.distributed.checkpoint as dcp, ckpt.dcp
>>> dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("step-1000/"))

``dcp.load`` plans what each rank needs — its shard of each tensor, however the checkpoint was sharded when
it was saved (resharding) — and the reader copies those boxes straight from the checkpoint's memory maps into
the state dict's tensors, in parallel, with the GIL released: no ``torch.load`` of each item, no intermediate
copy. It reads every format ckpt reads, not only DCP: an hfai, PyTorch-BigGraph, RecIS, ``.pt`` or
safetensors checkpoint loads into a sharded model the same way (each tensor one chunk).

:class:`Writer` writes what ``dcp.save`` (or ``dcp.async_save``) plans, in a job of any number of ranks:
each rank its own items, straight from its tensors, into one staging area; the coordinator commits once
every rank's results are in. Durable (fsync'd, swapped in whole; a crash on any rank leaves the old
checkpoint or the new one) and loadable by every torch from 2.0.

torch is imported when :class:`Reader` or :class:`Writer` is first used (``import ckpt`` never imports it).
"""

from __future__ import annotations

import dataclasses
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
                     storage_options: "dict[str, str] | None" = None, sync: bool = True,
                     checksums: bool = True) -> None: ...


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
        instead); an object-storage URL (``s3://bucket/step-100``) is read lazily, with ``storage_options``
        (see ``ckpt.open``): each rank fetches the metadata and the byte ranges of its own boxes. ``limits``: ckpt's read limits (``ckpt.LIMITS``).

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
                # A URL is read lazily: each rank fetches .metadata and the byte ranges of its own boxes.
                self._ck = ckpt.open(self.path, storage_options=self.storage_options, lazy=True, **self.limits)
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


@dataclasses.dataclass(frozen=True)
class _RankTicket:
    """What the coordinator puts into every rank's save plan (``SavePlan.storage_data``): the ticket of the
    save it began, which each rank joins to write into the same staging area."""

    ticket: bytes


@dataclasses.dataclass(frozen=True)
class _RankReport:
    """What each rank's write results carry besides its items (``WriteResult.storage_data`` of one extra
    result, under the key :data:`_REPORT_FQN`): its report for the coordinator's commit (its outcome and the
    checksums of its files). ``finish`` takes these out; they never reach ``.metadata``."""

    rank: int
    report: bytes


_REPORT_FQN = "ckpt.rank_report"

# The save each destination has in progress in this process (its coordinator's): a save that failed on some
# rank never reaches `finish`, and its writer would hold the destination's lock; the next save to the same
# destination from this process gives it up first (removes its staging directory, releases the lock).
_open_saves: dict = {}


def _writer_class() -> Any:
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.checkpoint import StorageWriter  # noqa: PLC0415
    from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: PLC0415
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata  # noqa: PLC0415
    from torch.distributed.checkpoint.planner import WriteItemType  # noqa: PLC0415
    from torch.distributed.checkpoint.storage import WriteResult  # noqa: PLC0415
    from torch.futures import Future  # noqa: PLC0415

    import ckpt  # noqa: PLC0415
    from ckpt import _ckpt  # noqa: PLC0415

    class Writer(StorageWriter):
        """A ``torch.distributed.checkpoint.StorageWriter`` that writes through ckpt, in a job of any number
        of ranks (or one process without a process group).

        ``path``: the checkpoint directory (or ``dcp.save(..., checkpoint_id=...)``); an object-storage URL
        (``s3://bucket/step-100``) is written there with ``storage_options`` (see ``ckpt.save``).
        ``dcp_profile``: ``"max-compat"`` (loads in torch 2.0 to 2.15, the default) or ``"torch213"`` (torch
        2.13's layout). ``sync``: fsync every file (the default; ``False`` trades crash safety for speed).
        ``checksums``: record a CRC-32 per item in ``ckpt.checksums.json`` (``ckpt verify`` checks them).

        Every rank writes only its own items, into its own file ``__{rank}_0.distcp``, straight from its
        tensors (with the GIL released). The ranks write into one staging directory the coordinator creates
        beside the destination; the coordinator commits in ``finish``, once every rank's results are in:
        ``.metadata`` last, then the directory swapped in whole (or, for a URL, the object-store commit). A
        save killed at any moment leaves the previous checkpoint whole; the next save removes what it left.
        The ranks must share the destination's file system (or save to a URL).

        >>> dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("step-1000/"))
        >>> dcp.async_save(state_dict, storage_writer=ckpt.dcp.Writer("step-1000/"))
        """

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *, dcp_profile: "str | None" = None,
                     storage_options: "dict[str, str] | None" = None, sync: bool = True,
                     checksums: bool = True) -> None:
            super().__init__()
            self.path = None if path is None else os.fspath(path)
            self.dcp_profile = dcp_profile
            self.storage_options = storage_options
            self.sync = sync
            self.checksums = checksums
            self.save_id = str(uuid.uuid4())
            self.rank = 0
            self.is_coordinator = True
            self._save: Any = None

        def __reduce__(self) -> Any:
            # An async save in another process (torch's process-based checkpointer) pickles the writer: the
            # class is made on first use, so it is named through the module; the save in progress stays here.
            state = dict(self.__dict__)
            state["_save"] = None
            return (_new_writer, (), state)

        def _give_up(self) -> None:
            save, self._save = self._save, None
            if save is not None:
                if _open_saves.get(self.path) is save:
                    del _open_saves[self.path]
                save.abort()

        def reset(self, checkpoint_id: "str | os.PathLike[str] | None" = None) -> None:
            # A save that never reached `finish` (a rank failed) is given up: no rank writes into it any
            # more once the next save begins.
            self._give_up()
            if checkpoint_id is not None:
                self.path = os.fspath(checkpoint_id)
            self.save_id = str(uuid.uuid4())

        def _path(self) -> str:
            if self.path is None:
                raise ckpt.UsageError("ckpt.dcp.Writer: no checkpoint path (give one, or checkpoint_id)",
                                      fault="usage")
            return self.path

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            self.is_coordinator = is_coordinator
            rank = kwargs.get("rank")
            if rank is None:
                rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            self.rank = rank
            many = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
            if not kwargs.get("use_collectives", True) and many:
                raise ckpt.UsageError(
                    "ckpt.dcp.Writer: dcp.save(..., use_collectives=False) has every rank save on its own; "
                    "ckpt commits one checkpoint for all ranks: save with use_collectives=True", fault="usage")

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
            # The coordinator begins the save: the lock, clean-up of a killed save, the staging directory.
            self._give_up()
            stale = _open_saves.pop(self._path(), None)
            if stale is not None:
                stale.abort()
            self._save = _ckpt.dcp_begin(self._path(), len(plans), self.dcp_profile, self.sync, self.checksums,
                                         self.storage_options)
            _open_saves[self._path()] = self._save
            ticket = _RankTicket(self._save.ticket())
            return [dataclasses.replace(plan, storage_data=ticket) for plan in plans]

        def write_data(self, plan: Any, planner: Any) -> Future:
            ticket = plan.storage_data
            if not isinstance(ticket, _RankTicket):
                raise ckpt.UsageError("ckpt.dcp.Writer: the save plan carries no ckpt ticket (was "
                                      "prepare_global_plan skipped?)", fault="usage")
            if self.is_coordinator and self._save is not None:
                save = self._save
            else:
                save = _ckpt.dcp_join(self._path(), ticket.ticket, self.rank, self.dcp_profile, self.sync,
                                      self.checksums, self.storage_options)
            items = []
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    obj: Any = bytes(data.getbuffer())
                else:
                    obj = data.detach()
                    if obj.device.type != "cpu":
                        obj = obj.cpu()
                offsets = None if item.index.offset is None else list(item.index.offset)
                items.append((item.index.fqn, offsets, obj))
            try:
                placed = save.write(items)
            except BaseException as e:
                save.report(f"{type(e).__name__}: {e}")
                raise
            results = []
            for item, (relative_path, offset, length, transforms) in zip(plan.items, placed):
                info = _StorageInfo(relative_path, offset, length, transform_descriptors=transforms or None)
                results.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=info))
            report = _RankReport(self.rank, save.report(None))
            results.append(WriteResult(index=MetadataIndex(_REPORT_FQN), size_in_bytes=0, storage_data=report))
            fut: Future = Future()
            fut.set_result(results)
            return fut

        def finish(self, metadata: Any, results: List[List[Any]]) -> None:
            save, self._save = self._save, None
            if save is not None and _open_saves.get(self.path) is save:
                del _open_saves[self.path]
            if save is None:
                raise ckpt.UsageError("ckpt.dcp.Writer.finish: no save in progress on this rank (finish runs "
                                      "on the coordinator, after prepare_global_plan)", fault="usage")
            reports: dict = {}
            storage: dict = {}
            for wr_list in results:
                for wr in wr_list:
                    if isinstance(wr.storage_data, _RankReport):
                        reports[wr.storage_data.rank] = wr.storage_data.report
                    else:
                        storage[wr.index] = wr.storage_data
            world = len(results)
            if sorted(reports) != list(range(world)):
                save.abort()
                raise ckpt.Error(f"ckpt.dcp.Writer: reports from ranks {sorted(reports)} of {world}; every rank "
                                 "writes through ckpt.dcp.Writer", fault="io")
            entries = []
            for fqn, md in metadata.state_dict_metadata.items():
                if isinstance(md, TensorStorageMetadata):
                    chunks = [(list(c.offsets), list(c.sizes)) for c in md.chunks]
                    entries.append((fqn, str(md.properties.dtype), list(md.size), chunks,
                                    bool(md.properties.requires_grad)))
                else:
                    entries.append((fqn, None, None, None, False))
            rows = []
            for index, info in storage.items():
                rows.append((index.fqn, None if index.offset is None else list(index.offset), index.index,
                             info.relative_path, info.offset, info.length,
                             list(getattr(info, "transform_descriptors", None) or [])))
            planner_data = None
            if isinstance(metadata.planner_data, dict):
                planner_data = [(fqn, list(path)) for fqn, path in metadata.planner_data.items()
                                if isinstance(path, tuple) and all(isinstance(p, (str, int)) for p in path)]
            save.commit(entries, rows, planner_data, self.save_id, [reports[r] for r in range(world)])
            # What dcp.save returns: the metadata as written.
            metadata.storage_data = storage
            metadata.storage_meta = self.storage_meta()

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


def _new_writer() -> Any:
    """A blank :class:`Writer`, whose state pickle then sets (``Writer.__reduce__``)."""
    cls = __getattr__("Writer")
    return cls.__new__(cls)


def fqn_of(req: Any) -> str:
    return req.storage_index.fqn


_classes: dict = {}


def __getattr__(name: str) -> Any:
    makers = {"Reader": _reader_class, "Writer": _writer_class}
    if name in makers:
        if name not in _classes:
            try:
                _classes[name] = makers[name]()
            except ImportError as e:
                import ckpt  # noqa: PLC0415

                raise ckpt.UsageError(
                    f"ckpt.dcp.{name} needs torch with torch.distributed.checkpoint, which this Python cannot "
                    f"import ({e}); install a torch built with distributed support (the pip wheels for Linux "
                    "are), or read and write checkpoints with ckpt.load / ckpt.save, which need no torch",
                    fault="usage") from e
        return _classes[name]
    raise AttributeError(f"module 'ckpt.dcp' has no attribute {name!r}")

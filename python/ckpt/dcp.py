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
from typing import TYPE_CHECKING, Any, List, Sequence
from ._dtypes import dtype_arg

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

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *, to: str = "dcp",
                     dcp_profile: "str | None" = None, storage_options: "dict[str, str] | None" = None,
                     sync: bool = True, checksums: bool = True, max_shard_size: "int | str | None" = None,
                     dtype: Any = None, include: "str | Sequence[str]" = (),
                     exclude: "str | Sequence[str]" = (), strip_prefix: "str | None" = None,
                     add_prefix: "str | None" = None) -> None: ...


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
    path: "str | None" = None  # where the ranks write: the destination, or an overwrite's staging path


@dataclasses.dataclass(frozen=True)
class _RankReport:
    """What each rank's write results carry besides its items (``WriteResult.storage_data`` of one extra
    result, under the key :data:`_REPORT_FQN`): its report for the coordinator's commit (its outcome and the
    checksums of its files). ``finish`` takes these out; they never reach ``.metadata``."""

    rank: int
    report: bytes


_REPORT_FQN = "ckpt.rank_report"


@dataclasses.dataclass(frozen=True)
class _HfLayout:
    """What the coordinator of a ``to="hf"`` save puts into every rank's plan: the shards (each a list of
    ``(name, fqn, dtype, size)``, the tensor's name in the files, its key in the state dict, the dtype it is
    written in, its global size), the rank that writes each, where every tensor's chunks are (``fqn ->
    [(rank, offsets, sizes)]``, the planner's own chunks), the source dtypes, the values kept (``(fqn,
    rank)``: the BYTE_IO items, recorded in the first shard's ``__metadata__`` by rank 0) and the entries as
    planned (for those records). The ticket and the shard files' names are added by the coordinator."""

    world: int
    shards: list
    owners: list
    chunks: dict
    src_dtypes: dict
    values: list
    entries: list
    ticket: bytes = b""
    files: list = dataclasses.field(default_factory=list)
    path: "str | None" = None  # where the ranks write: the destination, or an overwrite's staging path


def _nbytes(dtype: str, size: "list[int]") -> int:
    import torch  # noqa: PLC0415

    n = getattr(torch, dtype).itemsize
    for d in size:
        n *= int(d)
    return n


def _hf_entries(plans: List[Any]) -> "tuple[list, dict, dict, dict]":
    """Every rank's items in the order DCP's metadata lists them (rank by rank, items in plan order): the
    entries ``(fqn, path, spec)`` (``spec`` a tensor's ``(dtype, size, requires_grad)`` or ``None`` for a
    value), the chunks of each tensor, its source dtype, and the rank holding each value."""
    from torch.distributed.checkpoint.planner import WriteItemType  # noqa: PLC0415

    entries: list = []
    chunks: dict = {}
    dtypes: dict = {}
    holders: dict = {}
    seen: set = set()
    for rank, plan in enumerate(plans):
        paths = plan.planner_data if isinstance(getattr(plan, "planner_data", None), dict) else {}
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                holders.setdefault(fqn, rank)
                spec: Any = None
            else:
                td = item.tensor_data
                dtype = str(td.properties.dtype).removeprefix("torch.")
                chunks.setdefault(fqn, []).append((rank, [int(x) for x in td.chunk.offsets],
                                                   [int(x) for x in td.chunk.sizes]))
                dtypes[fqn] = dtype
                spec = (dtype, [int(x) for x in td.size], bool(td.properties.requires_grad))
            if fqn not in seen:
                seen.add(fqn)
                path = paths.get(fqn)
                ok = isinstance(path, tuple) and all(isinstance(p, (str, int)) for p in path)
                entries.append((fqn, list(path) if ok else [], spec))
    return entries, chunks, dtypes, holders


def _hf_layout(writer: Any, plans: List[Any]) -> _HfLayout:
    """The coordinator's plan of a ``to="hf"`` save (see :class:`_HfLayout`): the shards ``ckpt.convert(...,
    to="hf")`` would write for the same entries and options, each given to a rank (shard 0, with the
    records, to rank 0; the others to the rank with the fewest bytes so far)."""
    import warnings  # noqa: PLC0415

    import ckpt  # noqa: PLC0415
    from ckpt import _ckpt  # noqa: PLC0415

    entries, chunks, dtypes, holders = _hf_entries(plans)
    chosen, stored, shards, _records, (_tensors, _values, dropped) = _ckpt.hf_layout(
        entries, writer.max_shard_size, writer.include, writer.exclude, writer.strip_prefix, writer.add_prefix,
        writer.dtype)
    if not any(c is not None for c in chosen):
        names = ", ".join(fqn for fqn, _, _ in entries[:8]) + (", ..." if len(entries) > 8 else "")
        raise ckpt.UsageError(f"ckpt.dcp.Writer(to=\"hf\"): include={writer.include} exclude={writer.exclude} "
                              f"select none of the {len(entries)} entries ({names})", fault="usage")
    tensors: dict = {}
    values = []
    for (fqn, _path, spec), c in zip(entries, chosen):
        if c is None:
            continue
        if spec is None:
            values.append((fqn, holders[fqn]))
        else:
            tensors[c[0]] = (fqn, c[1], spec[1])
    planned = []
    for members in shards:
        row = []
        for k in members:
            name, dtype, shape = stored[k]
            src = tensors.get(name)
            if src is None or src[1] != dtype or list(src[2]) != list(shape):
                raise ckpt.UsageError(
                    f"ckpt.dcp.Writer(to=\"hf\"): {name!r} ({dtype}) is not a plain safetensors tensor (a dtype "
                    "safetensors lacks, or a value holding tensors); exclude it, or save a DCP checkpoint "
                    "(to=\"dcp\") and convert it with ckpt.convert(..., to=\"hf\")", fault="usage")
            row.append((name, src[0], dtype, list(shape)))
        planned.append(row)
    if dropped:
        warnings.warn(f"ckpt.dcp.Writer(to=\"hf\"): left out (cannot be stored): {', '.join(dropped)}",
                      stacklevel=3)
    world = len(plans)
    load = [0] * world
    owners = []
    for i, row in enumerate(planned):
        owner = 0 if i == 0 else min(range(world), key=lambda r: (load[r], r))
        owners.append(owner)
        load[owner] += sum(_nbytes(dtype, size) for _n, _f, dtype, size in row)
    layout = _HfLayout(world=world, shards=planned, owners=owners, chunks=chunks, src_dtypes=dtypes,
                       values=values, entries=entries)
    return layout


# ckpt's own gloo group for the chunks of a to="hf" save, one per default process group.
_groups: dict = {}


def _exchange_group() -> Any:
    from datetime import timedelta  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    default = dist.distributed_c10d._get_default_group()
    held = _groups.get(id(default))
    if held is None or held[0] is not default:
        held = (default, dist.new_group(backend="gloo", timeout=timedelta(minutes=5)))
        _groups[id(default)] = held
    return held[1]


def _hf_write(writer: Any, plan: Any, planner: Any) -> list:
    """One rank's part of a ``to="hf"`` save: its items resolved, each shard's chunks sent to the rank
    that writes it (round by round: in round ``r`` every owner assembles its ``r``-th shard, so a rank
    holds one shard's worth at a time), its own shards written, and its report. Every rank takes part in
    every round even after an error of its own, so that no rank waits for it; the error is then reported
    and raised."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.checkpoint.planner import WriteItemType  # noqa: PLC0415
    from torch.distributed.checkpoint.storage import WriteResult  # noqa: PLC0415

    import ckpt  # noqa: PLC0415
    from ckpt import _ckpt  # noqa: PLC0415

    from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: PLC0415

    lay = plan.storage_data
    if not isinstance(lay, _HfLayout):
        raise ckpt.UsageError("ckpt.dcp.Writer: the save plan carries no ckpt layout (was prepare_global_plan "
                              "skipped?)", fault="usage")
    rank = writer.rank
    if writer.is_coordinator and writer._save is not None:
        save = writer._save
    else:
        save = _ckpt.hf_join(lay.path or writer._path(), lay.ticket, rank, writer.sync, writer.checksums,
                             writer.storage_options)
    error: "BaseException | None" = None
    local: dict = {}
    local_bytes: dict = {}
    try:
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                local_bytes[item.index.fqn] = bytes(data.getbuffer())
            else:
                t = data.detach()
                local[(item.index.fqn, tuple(int(x) for x in item.index.offset or ()))] = \
                    t.cpu() if t.device.type != "cpu" else t
    except BaseException as e:  # noqa: BLE001
        error = e
    per_owner = [[i for i, o in enumerate(lay.owners) if o == r] for r in range(lay.world)]
    rounds = max(len(x) for x in per_owner)
    group = writer._group
    for r in range(rounds):
        send: list = [[] for _ in range(lay.world)]
        for owner in range(lay.world):
            if owner == rank or r >= len(per_owner[owner]) or error is not None:
                continue
            try:
                for _name, fqn, _dtype, _size in lay.shards[per_owner[owner][r]]:
                    for cr, offsets, _sizes in lay.chunks[fqn]:
                        if cr == rank:
                            t = local[(fqn, tuple(offsets))]
                            send[owner].append(t.contiguous().reshape(-1).view(torch.uint8))
                if r == 0 and owner == 0:
                    for fqn, holder in lay.values:
                        if holder == rank:
                            b = local_bytes[fqn]
                            send[0].append(torch.frombuffer(bytearray(len(b).to_bytes(8, "little") + b),
                                                            dtype=torch.uint8))
            except BaseException as e:  # noqa: BLE001
                error, send[owner] = e, []
        counts = [sum(int(x.numel()) for x in parts) for parts in send]
        received = torch.empty(0, dtype=torch.uint8)
        got = [0] * lay.world
        if lay.world > 1:
            counts_out = torch.empty(lay.world, dtype=torch.int64)
            dist.all_to_all_single(counts_out, torch.tensor(counts, dtype=torch.int64), group=group)
            got = [int(x) for x in counts_out]
            flat = [x for parts in send for x in parts]
            inp = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8)
            received = torch.empty(sum(got), dtype=torch.uint8)
            dist.all_to_all_single(received, inp, output_split_sizes=got, input_split_sizes=counts, group=group)
        del send
        if r >= len(per_owner[rank]) or error is not None:
            continue
        try:
            _hf_write_shard(writer, save, lay, per_owner[rank][r], received, got, local, local_bytes)
        except BaseException as e:  # noqa: BLE001
            error = e
    if error is not None:
        save.report(f"{type(error).__name__}: {error}")
        raise error
    results = [WriteResult(index=item.index, size_in_bytes=0, storage_data=None) for item in plan.items]
    report = _RankReport(rank, save.report(None))
    results.append(WriteResult(index=MetadataIndex(_REPORT_FQN), size_in_bytes=0, storage_data=report))
    return results


def _hf_write_shard(writer: Any, save: Any, lay: _HfLayout, shard: int, received: Any, got: list,
                    local: dict, local_bytes: dict) -> None:
    """Assembles shard ``shard`` from this rank's chunks and those ``received`` (``got[k]`` bytes from rank
    ``k``, in the order :func:`_hf_write` sends them), casts, and writes it; shard 0 with the records."""
    import torch  # noqa: PLC0415

    import ckpt  # noqa: PLC0415
    from ckpt import _ckpt  # noqa: PLC0415

    starts = [sum(got[:k]) for k in range(len(got))]
    pos = list(starts)

    def take(source: int, n: int) -> Any:
        if pos[source] + n > starts[source] + got[source]:
            raise ckpt.Error(f"ckpt.dcp.Writer(to=\"hf\"): rank {source} sent less than shard {shard} needs "
                             "(it failed: see its error)", fault="io")
        out = received[pos[source]:pos[source] + n]
        pos[source] += n
        return out

    tensors = []
    for name, fqn, dtype, size in lay.shards[shard]:
        full = torch.empty(size, dtype=getattr(torch, lay.src_dtypes[fqn]))
        es = full.element_size()
        whole = full.reshape(size or [1]).view(torch.uint8)
        covered = 0
        for cr, offsets, sizes in lay.chunks[fqn]:
            offs, szs = (offsets, sizes) if size else ([0], [1])
            n = 1
            for z in szs:
                n *= z
            if cr == writer.rank:
                data = local[(fqn, tuple(offsets))].contiguous().reshape(szs).view(torch.uint8)
            else:
                data = take(cr, n * es).view(szs[:-1] + [szs[-1] * es])
            at = tuple(slice(o, o + z) for o, z in zip(offs[:-1], szs[:-1])) + \
                (slice(offs[-1] * es, (offs[-1] + szs[-1]) * es),)
            whole[at].copy_(data)
            covered += n
        if covered != full.numel():
            raise ckpt.Error(f"ckpt.dcp.Writer(to=\"hf\"): the chunks DCP planned for {fqn!r} hold {covered} of its "
                             f"{full.numel()} elements", fault="io")
        if dtype != lay.src_dtypes[fqn]:
            full = full.to(getattr(torch, dtype))
        tensors.append((name, full))
    records = None
    if shard == 0:
        values: dict = {}
        for fqn, holder in lay.values:
            if holder == writer.rank:
                values[fqn] = local_bytes[fqn]
            else:
                n = int.from_bytes(take(holder, 8).numpy().tobytes(), "little")
                values[fqn] = take(holder, n).numpy().tobytes()
        entries = [(fqn, path, values.get(fqn) if spec is None else spec) for fqn, path, spec in lay.entries]
        _chosen, stored, _shards, records, _counts = _ckpt.hf_layout(
            entries, writer.max_shard_size, writer.include, writer.exclude, writer.strip_prefix,
            writer.add_prefix, writer.dtype)
        planned = {name for row in lay.shards for name, _f, _d, _s in row}
        extra = [name for name, _d, _s in stored if name not in planned]
        if extra:
            raise ckpt.UsageError(f"ckpt.dcp.Writer(to=\"hf\"): the values {extra} hold tensors, which Hugging Face "
                                  "shards written from a job do not take: exclude them, or save a DCP checkpoint "
                                  "(to=\"dcp\") and convert it", fault="usage")
    if any(pos[k] != starts[k] + got[k] for k in range(len(got))):
        raise ckpt.Error(f"ckpt.dcp.Writer(to=\"hf\"): more bytes arrived than shard {shard} holds", fault="io")
    save.write_shard(lay.files[shard], tensors, records)

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
        The destination is a checkpoint of the same kind (replaced) or new: anything else there (a file, a
        directory of other files, another format) fails the save with ``ckpt.UsageError`` on every rank,
        unless ``overwrite=True``, which writes the checkpoint beside it and swaps it in whole once
        committed (under a URL: removes the objects that stood there once the new checkpoint is committed).
        The ranks must share the destination's file system (or save to a URL).

        >>> dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("step-1000/"))
        >>> dcp.async_save(state_dict, storage_writer=ckpt.dcp.Writer("step-1000/"))
        """

        def __init__(self, path: "str | os.PathLike[str] | None" = None, *, to: str = "dcp",
                     dcp_profile: "str | None" = None, storage_options: "dict[str, str] | None" = None,
                     sync: bool = True, checksums: bool = True, max_shard_size: "int | str | None" = None,
                     dtype: Any = None, include: "str | Sequence[str]" = (),
                     exclude: "str | Sequence[str]" = (), strip_prefix: "str | None" = None,
                     add_prefix: "str | None" = None, overwrite: bool = False) -> None:
            super().__init__()
            if to not in ("dcp", "distcp", "hf"):
                raise ckpt.UsageError(f"ckpt.dcp.Writer: to={to!r}: \"dcp\" (a DCP checkpoint) or \"hf\" "
                                      "(Hugging Face safetensors shards)", fault="usage")
            self.to = "hf" if to == "hf" else "dcp"
            hf_options = {"max_shard_size": max_shard_size, "dtype": dtype, "include": include or None,
                          "exclude": exclude or None, "strip_prefix": strip_prefix, "add_prefix": add_prefix}
            if self.to == "dcp":
                given = [k for k, v in hf_options.items() if v is not None]
                if given:
                    raise ckpt.UsageError(f"ckpt.dcp.Writer: {given[0]}= applies to Hugging Face shards "
                                          "(to=\"hf\"); a DCP checkpoint keeps every item as it is", fault="usage")
            elif dcp_profile is not None:
                raise ckpt.UsageError("ckpt.dcp.Writer: dcp_profile= applies to DCP checkpoints (to=\"dcp\"), "
                                      "not to Hugging Face shards", fault="usage")
            self.path = None if path is None else os.fspath(path)
            self.dcp_profile = dcp_profile
            self.storage_options = storage_options
            self.sync = sync
            self.checksums = checksums
            self.max_shard_size = None if max_shard_size is None else _ckpt.hf_parse_size(max_shard_size)
            self.dtype = dtype_arg(dtype)
            self.include = [include] if isinstance(include, str) else list(include)
            self.exclude = [exclude] if isinstance(exclude, str) else list(exclude)
            self.strip_prefix = strip_prefix
            self.add_prefix = add_prefix
            self.overwrite = overwrite
            self.save_id = str(uuid.uuid4())
            self.rank = 0
            self.is_coordinator = True
            self._save: Any = None
            self._group: Any = None

        def __reduce__(self) -> Any:
            # An async save in another process (torch's process-based checkpointer) pickles the writer: the
            # class is made on first use, so it is named through the module; the save in progress stays here.
            state = dict(self.__dict__)
            state["_save"] = None
            state["_group"] = None
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
            # Hugging Face shards from several ranks: each shard's chunks travel to the rank that writes it
            # over a gloo group of ckpt's own (not the job's: an async save runs beside training).
            self._group = _exchange_group() if self.to == "hf" and many else None

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
            # The coordinator begins the save: the lock, clean-up of a killed save, the staging directory.
            self._give_up()
            stale = _open_saves.pop(self._path(), None)
            if stale is not None:
                stale.abort()
            if self.to == "hf":
                layout = _hf_layout(self, plans)
                self._save = _ckpt.hf_begin(self._path(), len(plans), self.sync, self.checksums,
                                            self.storage_options, self.overwrite)
                _open_saves[self._path()] = self._save
                shared: Any = dataclasses.replace(layout, ticket=self._save.ticket(),
                                                  files=self._save.shard_names(len(layout.shards)),
                                                  path=self._save.write_path())
                self._layout = shared
            else:
                self._save = _ckpt.dcp_begin(self._path(), len(plans), self.dcp_profile, self.sync,
                                             self.checksums, self.storage_options, self.overwrite)
                _open_saves[self._path()] = self._save
                shared = _RankTicket(self._save.ticket(), self._save.write_path())
            return [dataclasses.replace(plan, storage_data=shared) for plan in plans]

        def write_data(self, plan: Any, planner: Any) -> Future:
            if self.to == "hf":
                fut: Future = Future()
                fut.set_result(_hf_write(self, plan, planner))
                return fut
            ticket = plan.storage_data
            if not isinstance(ticket, _RankTicket):
                raise ckpt.UsageError("ckpt.dcp.Writer: the save plan carries no ckpt ticket (was "
                                      "prepare_global_plan skipped?)", fault="usage")
            if self.is_coordinator and self._save is not None:
                save = self._save
            else:
                save = _ckpt.dcp_join(ticket.path or self._path(), ticket.ticket, self.rank, self.dcp_profile,
                                      self.sync, self.checksums, self.storage_options)
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
            done: Future = Future()
            done.set_result(results)
            return done

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
            if self.to == "hf":
                layout = self._layout
                weight_map = [(name, layout.files[s]) for s, members in enumerate(layout.shards)
                              for name, _fqn, _dtype, _size in members]
                total = sum(_nbytes(dtype, size) for members in layout.shards for _n, _f, dtype, size in members)
                save.commit(total if len(layout.files) > 1 else None, weight_map, layout.files,
                            [reports[r] for r in range(world)])
                metadata.storage_data = {}
                metadata.storage_meta = self.storage_meta()
                return
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

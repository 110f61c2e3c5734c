#!/usr/bin/env python3
"""Generate the PyTorch-BigGraph golden fixtures with the real torchbiggraph 1.0.0.

Usage (from the repository root)::

    .venv/bin/python conformance/python/pbg/make_fixtures.py OUTDIR

What it does, in a scratch working directory (PBG's config paths are relative to it):

1. writes a small deterministic graph, ``graph/edges.tsv``: 29 ``user_id`` entities (2 partitions),
   11 ``item`` entities (unpartitioned), relations ``follows`` (user_id -> user_id, operator
   ``linear``), ``likes`` (user_id -> item, ``complex_diagonal``) and ``similar`` (item -> item,
   ``translation``);
2. runs ``torchbiggraph_import_from_tsv`` (``convert_input_data``) into ``data/`` (entity path) and
   ``data/edges`` (edge path), then writes ``data/dynamic_rel_names.json`` (the importer writes it only
   for dynamic relations, but ``torchbiggraph_export_to_tsv`` needs it: PBG issue #211);
3. runs ``torchbiggraph_train`` (``train``) into ``ckpt/``: dimension 6, global embeddings,
   2 epochs x 2 edge chunks (versions 1..4), ``checkpoint_preservation_interval=1`` (snapshots
   ``epoch_1`` -> v2 and ``epoch_2`` -> v4; v2 preserved, v1 and v3 deleted), one Hogwild worker;
4. runs ``torchbiggraph_export_to_tsv`` (``make_tsv``) on the committed version into ``export/``;
5. writes hand-made HDF5 files with h5py in ``variants/`` (valid but unusual: float64, chunked+gzip,
   user block, no optimizer, empty partition) and ``bad/`` (each must fail with a specific error);
6. copies everything to OUTDIR with ``MANIFEST.json`` (every file: size, sha256; every HDF5 file:
   attributes with their types, datasets with dtype/shape/layout/sha256/attributes, creation-order
   tracking of groups, and the decoded optimizer blobs as typed trees) and ``STAMP.json``.

Shims (monkey-patches inside this process only; site-packages is not edited):

* determinism: PBG seeds each Hogwild worker with ``torch.manual_seed(os.getpid())`` and builds the
  bucket order from an unseeded ``random.Random()``; the generator passes a ``subprocess_init`` that
  re-seeds the worker, and replaces ``bucket_scheduling.random`` by a namespace whose ``Random()`` is
  seeded. torch's RNG in the main process is seeded; the environment is pinned (``pinenv.py``).
* export: torchbiggraph 1.0.0's ``export_to_tsv.write`` formats ``"%.9f" % x`` for every row of a
  parameter, which raises for 2-D parameters (the ``linear`` operator); PBG master fixed it by
  flattening the parameter. The generator applies master's fix (``write`` flattens its values), so
  ``export/relation_types.tsv`` is what master's tool writes; ``export/entities.tsv`` is unaffected.
* size: the importer's ``BufferedDataset`` writes edge datasets in chunks of 50 MiB (``BUFFER_SIZE``),
  which makes each edge file 150 MB however few edges it holds; the generator sets ``BUFFER_SIZE`` to
  64 elements (the format of the edge files is otherwise unchanged).

torchbiggraph 1.0.0 itself needed no compatibility shim with torch 2.13 / numpy 2.

The snapshot links written by PBG are absolute paths into the scratch directory, whose name is
random. When copying to OUTDIR the scratch prefix of each link is replaced by ``SCRATCH``
(``/nonexistent/pbg-fixture-scratch``), so the committed links are absolute, dangling (as after moving
a checkpoint: readers must resolve them by file name) and reproducible. The manifest records each
link's target.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from pinenv import PINNED_ENV, pin_environment  # noqa: E402

pin_environment()

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import torchtree  # noqa: E402
from pbg_setup import (  # noqa: E402
    EDGES,
    ITEMS,
    RELATIONS,
    SCRATCH,
    SEED,
    USERS,
    apply_determinism_shims,
    apply_export_shim,
    config_dict,
    seed_worker,
)

#: what comes out of training math (reproducible.py's rules): compared within a tolerance by
#: check_reproducible.py, everything else exactly. The ranking counts (``violators_*``: how many negatives
#: score at least as high as the positive, averaged over a chunk's edges) are decided by near-ties between
#: scores computed by different kernels, so they move by whole counts from one CPU to another.
TRAINING_DERIVED = {
    "ckpt/*.h5": {"datasets": ["embeddings", "model/*"], "blob_tensors": ["state.*.sum"]},
    "ckpt/training_stats.json": {"fields": ["stats.metrics.loss"], "counts": ["stats.metrics.violators_*"]},
    "export/*.tsv": {"numbers": True},
}


def make_graph(work: Path) -> None:
    rng = random.Random(SEED)
    users = [f"u{i:02d}" for i in range(USERS)]
    items = [f"item{i}" for i in range(ITEMS)]
    lines = []
    for _ in range(EDGES):
        rel = rng.choice(RELATIONS)
        pick = lambda ty: rng.choice(users if ty == "user_id" else items)  # noqa: E731
        lines.append(f"{pick(rel['lhs'])}\t{rel['name']}\t{pick(rel['rhs'])}\n")
    # Make sure every entity appears at least once.
    for u in users:
        lines.append(f"{u}\tlikes\t{items[0]}\n")
    for it in items:
        lines.append(f"{it}\tsimilar\t{items[1]}\n")
    (work / "graph").mkdir()
    (work / "graph" / "edges.tsv").write_text("".join(lines))


def run_pbg(work: Path) -> None:
    from torchbiggraph.config import ConfigSchema
    from torchbiggraph.converters.export_to_tsv import make_tsv
    from torchbiggraph.converters.import_from_tsv import convert_input_data
    from torchbiggraph.train import train

    import torchbiggraph.graph_storages as graph_storages

    graph_storages.BufferedDataset.BUFFER_SIZE = 64
    os.chdir(work)
    random.seed(SEED)
    torch.manual_seed(SEED)
    config = ConfigSchema.from_dict(config_dict())
    convert_input_data(
        config.entities, config.relations, config.entity_path, config.edge_paths,
        [Path("graph/edges.tsv")], lhs_col=0, rhs_col=2, rel_col=1,
    )
    Path("data/dynamic_rel_names.json").write_text(json.dumps([r["name"] for r in RELATIONS], indent=4))
    (work / "config.json").write_text(json.dumps(config_dict(), indent=4) + "\n")
    apply_determinism_shims()
    train(config, subprocess_init=seed_worker)
    apply_export_shim()
    Path("export").mkdir()
    with open("export/entities.tsv", "xt") as ef, open("export/relation_types.tsv", "xt") as rf:
        make_tsv(config, ef, rf)


# --------------------------------------------------------------------------------------------
# hand-made files


def write_partition(path: Path, embs: np.ndarray | None, *, optim: bytes | None = None,
                    format_version=1, **dataset_kwargs) -> None:
    with h5py.File(path, "w", **dataset_kwargs.pop("file_kwargs", {})) as hf:
        if format_version is not None:
            hf.attrs["format_version"] = format_version
        if embs is not None:
            hf.create_dataset("embeddings", data=embs, **dataset_kwargs)
        if optim is not None:
            hf.create_dataset("optimizer/state_dict", data=np.frombuffer(optim, dtype="V1"))


def row_adagrad_blob(n: int) -> bytes:
    """What PBG's RowAdagrad.state_dict() torch.saves for an n-row partition (torch 2.13)."""
    import io

    sd = {"state": {0: {"step": 0, "sum": torch.arange(n, dtype=torch.float32) / 4}},
          "param_groups": [{"lr": 0.05, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
    with io.BytesIO() as bf:
        torch.save(sd, bf)
        return bf.getvalue()


def make_variants(out: Path) -> dict[str, str]:
    """Valid but unusual files; returns {file: what it is}."""
    d = out / "variants"
    d.mkdir()
    base = (np.arange(5 * 3, dtype=np.float32).reshape(5, 3) - 7) / 8
    write_partition(d / "float64.h5", base.astype(np.float64))
    write_partition(d / "chunked_gzip.h5", base, optim=row_adagrad_blob(5), chunks=(2, 3), compression="gzip")
    write_partition(d / "userblock.h5", base, optim=row_adagrad_blob(5), file_kwargs={"userblock_size": 512})
    write_partition(d / "bigendian.h5", base.astype(">f4"))
    write_partition(d / "empty.h5", np.zeros((0, 3), dtype=np.float32), optim=row_adagrad_blob(0))
    write_partition(d / "format_version_float.h5", base, format_version=np.float64(1.0))
    with h5py.File(d / "fixed_string_attr.h5", "w") as hf:  # h5py 2.x-style attributes
        hf.attrs["format_version"] = np.int32(1)
        hf.attrs["config/json"] = np.bytes_(b'{"dimension": 3}')
        hf.create_dataset("embeddings", data=base)
    with h5py.File(d / "model_init.h5", "w") as hf:  # a user-made v0 model: no "model" group
        hf.attrs["format_version"] = 1
    return {
        "float64.h5": "float64 embeddings (accepted, converted to float32 like PBG's read_direct)",
        "chunked_gzip.h5": "chunked, gzip-compressed embeddings (read through libhdf5) with an optimizer blob",
        "userblock.h5": "a 512-byte user block before the superblock",
        "bigendian.h5": "big-endian float32 embeddings (converted)",
        "empty.h5": "a partition with 0 entities: (0, 3) dataset without storage",
        "format_version_float.h5": "format_version stored as float64 1.0 (PBG's `!= 1` accepts it)",
        "fixed_string_attr.h5": "int32 format_version and a fixed-length byte-string config/json",
        "model_init.h5": "a model file with only format_version (no model group, no optimizer)",
    }


def make_bad(out: Path) -> dict[str, str]:
    """Files each reader must reject; returns {file: the error variant expected}."""
    d = out / "bad"
    d.mkdir()
    f32 = np.ones((4, 3), dtype=np.float32)
    (d / "not_hdf5.h5").write_bytes(b"this is not an HDF5 file\n")
    write_partition(d / "missing_embeddings.h5", None, optim=row_adagrad_blob(4))
    write_partition(d / "int_embeddings.h5", np.ones((4, 3), dtype=np.int64))
    write_partition(d / "string_embeddings.h5", np.array([[b"a", b"b"], [b"c", b"d"]]))
    write_partition(d / "rank1_embeddings.h5", np.ones(12, dtype=np.float32))
    write_partition(d / "rank3_embeddings.h5", np.ones((2, 2, 3), dtype=np.float32))
    write_partition(d / "format_version_2.h5", f32, format_version=2)
    write_partition(d / "no_format_version.h5", f32, format_version=None)
    write_partition(d / "format_version_str.h5", f32, format_version="1")
    blob = row_adagrad_blob(4)
    write_partition(d / "corrupt_optimizer.h5", f32, optim=blob[: len(blob) // 2])
    write_partition(d / "garbage_optimizer.h5", f32, optim=b"\x00" * 64)
    with h5py.File(d / "optimizer_not_opaque.h5", "w") as hf:
        hf.attrs["format_version"] = 1
        hf.create_dataset("embeddings", data=f32)
        hf.create_dataset("optimizer/state_dict", data=np.ones(3, dtype=np.float64))
    with h5py.File(d / "huge_declared_shape.h5", "w") as hf:  # 4 TB declared, nothing stored
        hf.attrs["format_version"] = 1
        hf.create_dataset("embeddings", shape=(10**9, 1000), dtype="<f4")
    full = d / "truncated.h5"
    write_partition(full, np.ones((64, 16), dtype=np.float32))
    data = full.read_bytes()
    full.write_bytes(data[: len(data) - 1024])
    return {
        "not_hdf5.h5": "NotHdf5",
        "missing_embeddings.h5": "MissingDataset",
        "int_embeddings.h5": "WrongDtype",
        "string_embeddings.h5": "WrongDtype",
        "rank1_embeddings.h5": "WrongRank",
        "rank3_embeddings.h5": "WrongRank",
        "format_version_2.h5": "FormatVersion",
        "no_format_version.h5": "FormatVersion",
        "format_version_str.h5": "FormatVersion",
        "corrupt_optimizer.h5": "OptimizerBlob",
        "garbage_optimizer.h5": "OptimizerBlob",
        "optimizer_not_opaque.h5": "WrongDtype",
        "huge_declared_shape.h5": "BadStorage",
        "truncated.h5": "Truncated",
    }


# --------------------------------------------------------------------------------------------
# manifest


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def attr_json(v) -> dict:
    if isinstance(v, (bytes, np.bytes_)):
        return {"type": "bytes", "value": bytes(v).decode("utf-8", "replace")}
    if isinstance(v, str):
        return {"type": "str", "value": v}
    if isinstance(v, (np.integer, int)) and not isinstance(v, (bool, np.bool_)):
        return {"type": "int", "value": int(v)}
    if isinstance(v, (np.floating, float)):
        return {"type": "float", "value": float(v).hex()}
    return {"type": type(v).__name__, "value": repr(v)}


def blob_json(blob: bytes) -> dict:
    import io

    try:
        obj = torch.load(io.BytesIO(blob))
    except Exception as e:  # noqa: BLE001 - bad fixtures have undecodable blobs on purpose
        return {"error": type(e).__name__}
    tree, tensors, _ = torchtree.render(obj)
    return {"tree": tree, "tensors": [{k: t[k] for k in ("path", "dtype", "shape", "sha256")} for t in tensors]}


def hdf5_json(path: Path) -> dict:
    out: dict = {}
    with h5py.File(path, "r") as hf:
        out["attrs"] = {k: attr_json(hf.attrs[k]) for k in hf.attrs}
        datasets, groups = [], []

        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                groups.append({"path": name, "track_order": obj.id.get_create_plist().get_link_creation_order() != 0})
                return
            dt = obj.dtype
            rec = {
                "path": name,
                "dtype": f"V{dt.itemsize}" if dt.kind == "V" else dt.str,
                "shape": list(obj.shape),
                "layout": {0: "compact", 1: "contiguous", 2: "chunked"}.get(obj.id.get_create_plist().get_layout(), "other"),
                "sha256": sha256(obj[...].tobytes()) if dt.kind in "fiuV" and obj.nbytes < 2**26 else None,
                "attrs": {k: attr_json(obj.attrs[k]) for k in obj.attrs},
            }
            if name.endswith("optimizer/state_dict") and dt.kind == "V":
                rec["decoded"] = blob_json(obj[...].tobytes())
            datasets.append(rec)

        hf.visititems(visit)
        out["datasets"] = datasets
        out["groups"] = groups
    return out


def manifest(out: Path, cases: dict) -> dict:
    files = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if rel in ("MANIFEST.json", "STAMP.json", "README.md"):
            continue
        if p.is_symlink():
            target = os.readlink(p)
            files[rel] = {"kind": "symlink", "target": target}
        elif p.is_dir():
            continue
        else:
            data = p.read_bytes()
            rec = {"kind": "file", "size": len(data), "sha256": sha256(data)}
            if p.suffix == ".h5" and not rel.startswith("bad/"):
                rec["hdf5"] = hdf5_json(p)
            elif p.suffix == ".h5" and rel not in ("bad/not_hdf5.h5", "bad/truncated.h5"):
                rec["hdf5"] = hdf5_json(p)
            files[rel] = rec
    return {"files": files, **cases}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1]).resolve()
    import torchbiggraph

    work = Path(tempfile.mkdtemp(prefix="pbg-fixture-")).resolve()
    try:
        make_graph(work)
        run_pbg(work)
        os.chdir(HERE)
        if out.exists():
            for name in ("graph", "data", "ckpt", "export", "variants", "bad", "config.json", "MANIFEST.json", "STAMP.json"):
                target = out / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        out.mkdir(parents=True, exist_ok=True)
        for name in ("graph", "data", "ckpt", "export"):
            shutil.copytree(work / name, out / name, symlinks=True)
        for link in (out / "ckpt").rglob("*"):
            if link.is_symlink():
                target = os.readlink(link)
                if target.startswith(str(work) + "/"):
                    link.unlink()
                    link.symlink_to(SCRATCH + target[len(str(work)):])
        shutil.copy2(work / "config.json", out / "config.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    variants = make_variants(out)
    bad = make_bad(out)
    m = manifest(out, {"variants": variants, "bad": bad})
    (out / "MANIFEST.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    gen = Path(__file__).read_bytes()
    stamp = {
        "command": ".venv/bin/python conformance/python/pbg/make_fixtures.py conformance/fixtures/pbg",
        "generator": "pbg/make_fixtures.py",
        "generator_sha256": sha256(gen),
        "helpers_sha256": {
            **{n: sha256((HERE.parent / n).read_bytes()) for n in ("pinenv.py", "torchtree.py")},
            "pbg/pbg_setup.py": sha256((HERE / "pbg_setup.py").read_bytes()),
        },
        "torchbiggraph": (Path(torchbiggraph.__file__).parent / "VERSION.txt").read_text().strip(),
        "torch": torchtree.public_torch_version(),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "numpy": np.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "pinned_env": PINNED_ENV,
        "training_derived": TRAINING_DERIVED,
    }
    (out / "STAMP.json").write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(m['files'])} files to {out}")


if __name__ == "__main__":
    main()

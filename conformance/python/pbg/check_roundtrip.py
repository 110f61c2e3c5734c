#!/usr/bin/env python3
"""Check a checkpoint written by ckpt-pbg with the real torchbiggraph 1.0.0, then resume training.

Usage::

    .venv/bin/python conformance/python/pbg/check_roundtrip.py FIXTURE_DIR WORK_DIR

FIXTURE_DIR is ``conformance/fixtures/pbg`` (its ``ckpt/`` holds version 4, written by PBG). WORK_DIR is a
copy of it in which the Rust test committed version 5 with:

* every entity partition: ``embeddings * 2 + 0.25`` (float32), ``RowAdagrad`` sum ``+ 1``, everything else
  of the optimizer state unchanged;
* every model parameter ``- 0.5``; the model's Adagrad sums ``* 0.5``, steps unchanged;

plus ``export.safetensors`` (ckpt's safetensors export of version 5), ``rust_export/{entities,
relation_types}.tsv`` (ckpt's TSV export of version 5) and ``init/`` (version-0 files without optimizer
state or metadata, as users write for ``init_path``).

Checks, all through torchbiggraph's own code (``FileCheckpointStorage``, ``CheckpointManager``):

1. the committed version is 5; every partition and the model load, and equal the transform of version 4
   exactly; optimizer states load with ``torch.load`` (weights-only) and equal the transform;
2. the HDF5 layout matches what h5py writes for PBG (types of the attributes, float32 contiguous
   embeddings, OPAQUE ``V1`` blobs, the creation-order-tracked ``model`` group, ``state_dict_key``);
3. ckpt's safetensors export equals what PBG loads; ckpt's TSV export equals ``make_tsv``'s output on
   version 5 (with PBG master's flattening of 2-D parameters, as in the fixture generator);
4. the ``init/`` files load (embeddings, no optimizer state, no model state dict);
5. ``train`` resumes from version 5 with ``num_epochs = 3`` and commits version 6 (one more iteration),
   with a snapshot ``epoch_3`` and finite losses.

Prints one line per check; any failure raises.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torchbiggraph.checkpoint_manager import CheckpointManager, deserialize_optim_state  # noqa: E402
from torchbiggraph.checkpoint_storage import FileCheckpointStorage  # noqa: E402

ENTITIES = [("user_id", 0), ("user_id", 1), ("item", 0)]


def ok(msg: str) -> None:
    print(f"ok: {msg}", flush=True)


def equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        raise AssertionError(f"{what}: {a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}\n{a}\n{b}")


def check_values(fixture: Path, work: Path) -> dict:
    old = FileCheckpointStorage(str(fixture / "ckpt"))
    new = FileCheckpointStorage(str(work / "ckpt"))
    assert old.load_version() == 4, old.load_version()
    assert new.load_version() == 5, new.load_version()
    loaded = {}
    for entity, part in ENTITIES:
        e4, o4 = old.load_entity_partition(4, entity, part)
        e5, o5 = new.load_entity_partition(5, entity, part)
        equal(e5, e4 * 2 + 0.25, f"embeddings {entity} {part}")
        s4, s5 = deserialize_optim_state(o4), deserialize_optim_state(o5)
        equal(s5["state"][0]["sum"], s4["state"][0]["sum"] + 1, f"RowAdagrad sum {entity} {part}")
        assert s5["param_groups"] == s4["param_groups"], (s5["param_groups"], s4["param_groups"])
        assert {k: v for k, v in s5["state"][0].items() if k != "sum"} == {
            k: v for k, v in s4["state"][0].items() if k != "sum"
        }
        loaded[f"embeddings/{entity}/{part}"] = e5
        loaded[f"optimizer/embeddings/{entity}/{part}/state.0.sum"] = s5["state"][0]["sum"]
    ok("partitions of version 5 equal the transform of version 4 (embeddings and RowAdagrad state)")

    m_old, m_new = CheckpointManager(str(fixture / "ckpt")), CheckpointManager(str(work / "ckpt"))
    sd4, opt4 = m_old.read_model()
    sd5, opt5 = m_new.read_model()
    assert list(sd5) == list(sd4), (list(sd5), list(sd4))
    for k in sd4:
        equal(sd5[k], sd4[k] - 0.5, f"model {k}")
    assert opt5["param_groups"] == opt4["param_groups"]
    assert list(opt5["state"]) == list(opt4["state"])
    for i in opt4["state"]:
        equal(opt5["state"][i]["sum"], opt4["state"][i]["sum"] * 0.5, f"Adagrad sum {i}")
        equal(opt5["state"][i]["step"], opt4["state"][i]["step"], f"Adagrad step {i}")
        loaded[f"optimizer/model/state.{i}.sum"] = opt5["state"][i]["sum"]
        loaded[f"optimizer/model/state.{i}.step"] = opt5["state"][i]["step"]
    ok(f"model of version 5 equals the transform of version 4 ({len(sd4)} parameters, Adagrad state)")
    return {"sd": sd5, "loaded": loaded}


def check_layout(work: Path) -> None:
    ckpt = work / "ckpt"
    for entity, part in ENTITIES:
        with h5py.File(ckpt / f"embeddings_{entity}_{part}.v5.h5", "r") as hf:
            assert hf.attrs["format_version"] == 1 and hf.attrs["format_version"].dtype == np.int64
            assert isinstance(hf.attrs["config/json"], str)
            assert h5py.check_string_dtype(hf.attrs.get_id("config/json").dtype).encoding == "utf-8"
            assert hf.attrs["iteration/epoch_idx"].dtype == np.int64
            ds = hf["embeddings"]
            assert ds.dtype == np.dtype("<f4") and ds.chunks is None and ds.compression is None
            blob = hf["optimizer/state_dict"]
            assert blob.dtype == np.dtype("V1") and blob.ndim == 1
            assert blob.id.get_type().get_class() == h5py.h5t.OPAQUE
    with h5py.File(ckpt / "model.v5.h5", "r") as hf:
        g = hf["model"]
        gcpl = g.id.get_create_plist()
        assert gcpl.get_link_creation_order() == 3 and gcpl.get_attr_creation_order() == 3, "track_order"
        names = []
        g.visititems(lambda n, o: names.append((n, o)) if isinstance(o, h5py.Dataset) else None)
        for name, ds in names:
            assert ds.attrs["state_dict_key"] in (
                f"global_embs.emb_{name.split('/')[1]}",
                "rhs_operators.{}.{}".format(name.split("/")[1], name.split("/")[-1]),
            ), (name, ds.attrs["state_dict_key"])
            assert ds.dtype == np.dtype("<f4")
        assert hf["model/relations"].id.get_create_plist().get_link_creation_order() == 3
        assert hf["model/relations/0/operator/rhs"].id.get_create_plist().get_link_creation_order() == 0
    ok("HDF5 layout as h5py writes it for PBG (attribute types, float32, OPAQUE V1, tracked model group)")


def check_exports(work: Path, loaded: dict) -> None:
    st = load_file(str(work / "export.safetensors"))
    for name, t in loaded.items():
        equal(st[name], t, f"safetensors {name}")
    sd = CheckpointManager(str(work / "ckpt")).read_model()[0]
    for public in [k for k in st if k.startswith("model/")]:
        p = public[len("model/"):].split("/")
        private = f"global_embs.emb_{p[1]}" if p[0] == "entities" else f"{p[3]}_operators.{p[1]}.{p[4]}"
        equal(st[public], sd[private], f"safetensors {public}")
    ok(f"safetensors export equals what PBG loads ({len(st)} tensors)")

    from pbg_setup import apply_export_shim  # noqa: PLC0415
    from torchbiggraph.config import ConfigSchema  # noqa: PLC0415
    from torchbiggraph.converters.export_to_tsv import make_tsv  # noqa: PLC0415

    apply_export_shim()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        config = ConfigSchema.from_dict(json.loads((work / "config.json").read_text()))
        with open("pbg_entities.tsv", "xt") as ef, open("pbg_relation_types.tsv", "xt") as rf:
            make_tsv(config, ef, rf)
    finally:
        os.chdir(cwd)
    for ours, theirs in [("rust_export/entities.tsv", "pbg_entities.tsv"), ("rust_export/relation_types.tsv", "pbg_relation_types.tsv")]:
        a, b = (work / ours).read_bytes(), (work / theirs).read_bytes()
        assert a == b, f"{ours} differs from torchbiggraph_export_to_tsv's {theirs}"
    ok("TSV export of version 5 equals torchbiggraph_export_to_tsv's, byte for byte")


def check_init(work: Path) -> None:
    s = FileCheckpointStorage(str(work / "init"))
    assert s.load_version() == 0
    embs, optim = s.load_entity_partition(0, "user_id", 0)
    assert optim is None and embs.dtype == torch.float32 and embs.shape[1] == 6
    sd, optim = s.load_model(0)
    assert sd is None and optim is None
    ok("version-0 init files (no optimizer, no model group) load")


def check_resume(work: Path) -> None:
    from pbg_train import train_in  # noqa: PLC0415

    stats_before = (work / "ckpt" / "training_stats.json").read_text().count("\n")
    train_in(work, num_epochs=3)
    ckpt = FileCheckpointStorage(str(work / "ckpt"))
    assert ckpt.load_version() == 6, ckpt.load_version()
    for entity, part in ENTITIES:
        embs, optim = ckpt.load_entity_partition(6, entity, part)
        assert torch.isfinite(embs).all() and optim is not None
        assert not (work / "ckpt" / f"embeddings_{entity}_{part}.v5.h5").exists(), "v5 not cleaned up"
    assert (work / "ckpt" / "epoch_3" / "model.v6.h5").exists()
    lines = (work / "ckpt" / "training_stats.json").read_text().splitlines()
    new = [json.loads(line) for line in lines[stats_before:]]
    assert new and all(s["epoch_idx"] == 2 and s["edge_chunk_idx"] == 1 for s in new), new
    assert all(math.isfinite(s["stats"]["metrics"]["loss"]) for s in new)
    ok(f"torchbiggraph_train resumed from version 5 and committed version 6 ({len(new)} buckets)")


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fixture, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    torch.set_num_threads(1)
    values = check_values(fixture, work)
    check_layout(work)
    check_exports(work, values["loaded"])
    check_init(work)
    check_resume(work)


if __name__ == "__main__":
    main()

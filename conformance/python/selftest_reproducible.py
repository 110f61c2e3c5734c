#!/usr/bin/env python3
"""Self-test of the reproducibility checkers: they accept what another CPU could produce and reject the rest.

Usage::

    .venv/bin/python conformance/python/selftest_reproducible.py

For each fixture set (torch, PBG, hfai, DCP) this copies the committed fixtures, changes the copy, and runs
the set's ``check_reproducible.py`` (in this process) on committed vs changed:

* a one-ulp change of training-derived values, with every field computed from them (CRC-32s, the
  serialization checksum, digests, sizes) updated as a regeneration on another CPU would leave them, must
  pass, and so must a loss or ranking count that moved within its tolerance;
* a change beyond the tolerance, a one-ulp change of a value that is not trained, a renamed record, a
  changed stride, a missing file, a stale CRC-32 or digest, a changed text field must each fail, with the
  message that names the problem.

Exit status 0 when every expectation holds, 1 otherwise. Rules: conformance/fixtures/REPRODUCIBILITY.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import shutil
import struct
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "hfai"))

import reproducible as R  # noqa: E402

FIXTURES = HERE.parent / "fixtures"


def checker(rel: str) -> Callable[[list[str]], int]:
    """``main`` of a check_reproducible.py script, loaded as a module."""
    spec = importlib.util.spec_from_file_location(f"checker_{rel.replace('/', '_')}", HERE / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(argv: list[str]) -> int:
        old = sys.argv
        sys.argv = argv
        try:
            return module.main(argv) if module.main.__code__.co_argcount else module.main()
        finally:
            sys.argv = old

    return run


# --------------------------------------------------------------------------------------------
# changing files the way a regeneration would


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def step(values: np.ndarray, ulps: int) -> np.ndarray:
    """Each value moved by ``ulps`` units in the last place (away from zero for positive ``ulps``)."""
    ints = values.view(np.int32 if values.dtype == np.float32 else np.int16 if values.dtype.itemsize == 2 else np.int64)
    return (ints + ulps).view(values.dtype)


def reseal_zip(data: bytearray) -> None:
    """Recomputes every record's CRC-32 (where one is stored) and torch's serialization checksum."""
    records = R.zip_records(bytes(data))
    sid = next((r for r in records if r.name.endswith(".data/serialization_id")), None)
    for r in records:
        if r is sid:
            continue
        crc = zlib.crc32(data[r.data : r.data + r.size])
        for off in r.crc_fields:
            if struct.unpack_from("<I", data, off)[0] != 0:
                struct.pack_into("<I", data, off, crc)
    if sid is not None:
        data[sid.data + 20 : sid.data + sid.size] = R.serialization_checksum(bytes(data), records, sid).encode()
        crc = zlib.crc32(data[sid.data : sid.data + sid.size])
        for off in sid.crc_fields:
            if struct.unpack_from("<I", data, off)[0] != 0:
                struct.pack_into("<I", data, off, crc)


def tensor_record(data: bytes, tensor: str) -> tuple[R.ZipRecord, str]:
    """The record holding tensor ``tensor`` of a torch.save archive, and its dtype."""
    loaded = R.load_archive(data)
    t = next(t for t in loaded.tensors if t["path"] == tensor)
    prefix = next(r.name[: -len("data.pkl")] for r in R.zip_records(data) if r.name.endswith("data.pkl"))
    return next(r for r in R.zip_records(data) if r.name == f"{prefix}data/{t['storage_key']}"), t["dtype"]


def change_tensor(data: bytes, tensor: str, change: Callable[[np.ndarray], np.ndarray], reseal: bool = True) -> bytes:
    """The archive with tensor ``tensor``'s stored values changed (float32 or bfloat16 records)."""
    r, dtype = tensor_record(data, tensor)
    out = bytearray(data)
    np_dtype = np.float32 if dtype == "float32" else np.uint16 if dtype == "bfloat16" else None
    if np_dtype is None:
        raise ValueError(dtype)
    values = np.frombuffer(bytes(out[r.data : r.data + r.size]), dtype=np_dtype).copy()
    if dtype == "bfloat16":  # bfloat16 as its bit pattern: one ulp is one step of the pattern
        values = (values.astype(np.int32) + 1).astype(np.uint16) if change is ONE_ULP else values
    else:
        values = change(values)
    out[r.data : r.data + r.size] = values.tobytes()
    if reseal:
        reseal_zip(out)
    return bytes(out)


def ONE_ULP(v: np.ndarray) -> np.ndarray:  # noqa: N802 - used as a marker too
    return step(v, 1)


def BEYOND(v: np.ndarray) -> np.ndarray:  # noqa: N802
    return (v * np.float32(1.001)).astype(v.dtype)


def change_pickle_float(data: bytes, old: float, new: float) -> bytes:
    """The archive with the pickled float ``old`` (a BINFLOAT) replaced by ``new``, resealed."""
    out = bytearray(data)
    pkl = next(r for r in R.zip_records(data) if r.name.endswith("data.pkl"))
    body = bytes(out[pkl.data : pkl.data + pkl.size])
    needle = b"G" + struct.pack(">d", old)
    at = body.find(needle)
    if at < 0:
        raise ValueError(f"no pickled float {old!r}")
    out[pkl.data + at + 1 : pkl.data + at + 9] = struct.pack(">d", new)
    reseal_zip(out)
    return bytes(out)


def write_json(path: Path, obj: Any, **kw: Any) -> None:
    path.write_text(json.dumps(obj, **kw) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# the cases


class Selftest:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.failures: list[str] = []
        self.count = 0

    def expect(self, set_name: str, check: Callable[[list[str]], int], committed: Path, what: str,
               mutate: Callable[[Path], None], passes: bool, message: str = "") -> None:
        """Copies ``committed``, applies ``mutate`` and checks the checker's verdict (and message)."""
        self.count += 1
        fresh = self.tmp / f"case{self.count}"
        shutil.copytree(committed, fresh, symlinks=True)
        try:
            mutate(fresh)
        except Exception as e:  # noqa: BLE001 - a broken case is a self-test failure
            self.failures.append(f"{set_name}: {what}: could not prepare the case: {type(e).__name__}: {e}")
            return
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = check(["check", str(committed), str(fresh)])
        out = buf.getvalue()
        verdict = "passes" if rc == 0 else "fails"
        if (rc == 0) != passes:
            self.failures.append(f"{set_name}: {what}: the check {verdict}, expected the opposite:\n{out[-1500:]}")
        elif not passes and message and message not in out:
            self.failures.append(f"{set_name}: {what}: fails, but without {message!r}:\n{out[-1500:]}")
        else:
            first = next((ln for ln in out.splitlines() if ln.strip() and not ln.startswith("warning")), "")
            print(f"ok: {set_name}: {what}: {verdict}" + ("" if passes else f" ({first[:150]})"))
        shutil.rmtree(fresh)


def torch_cases(t: Selftest) -> None:
    import torch

    fx = FIXTURES / "torch"
    check = checker("check_reproducible.py")

    def reseal_manifest(d: Path, stem: str) -> None:
        m = json.loads((d / f"{stem}.json").read_text("utf-8"))
        digests = {x["path"]: x for x in R.load_archive((d / f"{stem}.pt").read_bytes()).tensors}
        for x in m["tensors"]:
            for k in ("sha256", "raw_sha256"):
                if k in x:
                    x[k] = digests[x["path"]][k]
        write_json(d / f"{stem}.json", m, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)

    def reseal_stamp(d: Path) -> None:
        s = json.loads((d / "STAMP.json").read_text("utf-8"))
        s["files"] = {n: (None if v is None else sha256((d / n).read_bytes())) for n, v in s["files"].items()}
        write_json(d / "STAMP.json", s, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)

    def retrain(stem: str, tensor: str, change: Callable, *, crc: bool = True, manifest: bool = True):
        def mutate(d: Path) -> None:
            p = d / f"{stem}.pt"
            p.write_bytes(change_tensor(p.read_bytes(), tensor, change, reseal=crc))
            if manifest:
                reseal_manifest(d, stem)
            reseal_stamp(d)

        return mutate

    e = t.expect
    e("torch", check, fx, "nothing changed", lambda d: None, True)
    e("torch", check, fx, "one ulp on every element of checkpoint's model.lin.weight",
      retrain("checkpoint", "model.lin.weight", ONE_ULP), True)
    e("torch", check, fx, "one ulp on optim_adam's exp_avg_sq (and every derived field)",
      retrain("optim_adam", "state.0.exp_avg_sq", ONE_ULP), True)
    e("torch", check, fx, "checkpoint's model.lin.weight 0.1% larger",
      retrain("checkpoint", "model.lin.weight", BEYOND), False, "largest magnitude")
    e("torch", check, fx, "one ulp on views.pt's a (not trained)",
      retrain("views", "a", ONE_ULP), False, "bytes differ")
    e("torch", check, fx, "one ulp on optim_adam's step count (not trained)",
      retrain("optim_adam", "state.0.step", ONE_ULP), False, "outside training-derived data")
    e("torch", check, fx, "one ulp on checkpoint's model.lin.weight, CRC-32s left stale",
      retrain("checkpoint", "model.lin.weight", ONE_ULP, crc=False), False, "CRC-32")
    e("torch", check, fx, "one ulp on checkpoint's model.lin.weight, manifest digest left stale",
      retrain("checkpoint", "model.lin.weight", ONE_ULP, manifest=False), False, "is not its digest")

    def rename_record(d: Path) -> None:
        p = d / "checkpoint.pt"
        data = p.read_bytes()
        p.write_bytes(data.replace(b"checkpoint/byteorder", b"checkpoint/byteordeR"))

    e("torch", check, fx, "a record of checkpoint.pt renamed", rename_record, False, "checkpoint/byteorder")

    def resave(stride: bool) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            p = d / "checkpoint.pt"
            obj = torch.load(p, weights_only=True)
            if stride:
                w = obj["model"]["lin.weight"]
                obj["model"]["lin.weight"] = w.t().contiguous().t()  # same values, strides (1, 6)
            torch.save(obj, p)
            reseal_manifest(d, "checkpoint")
            if stride:  # the manifest as the generator would write it
                m = json.loads((d / "checkpoint.json").read_text("utf-8"))
                next(x for x in m["tensors"] if x["path"] == "model.lin.weight")["stride"] = [1, 6]
                write_json(d / "checkpoint.json", m, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)
            reseal_stamp(d)

        return mutate

    e("torch", check, fx, "checkpoint.pt saved again unchanged", resave(False), True)
    e("torch", check, fx, "checkpoint's model.lin.weight saved with other strides", resave(True), False, "stride")
    e("torch", check, fx, "a missing file", lambda d: (d / "nocrc.json").unlink(), False, "committed but not generated")

    def declare_more(d: Path) -> None:
        s = json.loads((d / "STAMP.json").read_text("utf-8"))
        s["training_derived"]["views.pt"] = {"tensors": ["*"]}
        write_json(d / "STAMP.json", s, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)

    e("torch", check, fx, "the fresh STAMP.json declaring more training-derived tensors", declare_more, False,
      "training_derived differs")


def pbg_cases(t: Selftest) -> None:
    import h5py
    import torch

    import torchtree

    fx = FIXTURES / "pbg"
    check = checker("pbg/check_reproducible.py")

    def reseal_manifest(d: Path, rel: str) -> None:
        m = json.loads((d / "MANIFEST.json").read_text())
        rec = m["files"][rel]
        data = (d / rel).read_bytes()
        rec["size"], rec["sha256"] = len(data), sha256(data)
        if "hdf5" in rec:
            with h5py.File(d / rel, "r") as hf:
                for ds in rec["hdf5"]["datasets"]:
                    raw = hf[ds["path"]][...].tobytes()
                    ds["sha256"] = sha256(raw)
                    if "decoded" in ds and "tensors" in ds["decoded"]:
                        _, tensors, _ = torchtree.render(torch.load(io.BytesIO(raw)))
                        by_path = {x["path"]: x["sha256"] for x in tensors}
                        for x in ds["decoded"]["tensors"]:
                            x["sha256"] = by_path[x["path"]]
        (d / "MANIFEST.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")

    def change_dataset(rel: str, name: str, change: Callable) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            with h5py.File(d / rel, "r") as hf:
                ds = hf[name]
                off, n, dt = ds.id.get_offset(), ds.id.get_storage_size(), ds.dtype
            data = bytearray((d / rel).read_bytes())
            values = np.frombuffer(bytes(data[off : off + n]), dtype=dt).copy()
            data[off : off + n] = change(values).tobytes()
            (d / rel).write_bytes(bytes(data))
            reseal_manifest(d, rel)

        return mutate

    def change_blob_sum(rel: str, tensor: str) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            with h5py.File(d / rel, "r") as hf:
                ds = hf["optimizer/state_dict"]
                off, n = ds.id.get_offset(), ds.id.get_storage_size()
            data = bytearray((d / rel).read_bytes())
            data[off : off + n] = change_tensor(bytes(data[off : off + n]), tensor, ONE_ULP)
            (d / rel).write_bytes(bytes(data))
            reseal_manifest(d, rel)

        return mutate

    def change_stats(loss_ulps: int, violators: float, loss_factor: float = 1.0) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            p = d / "ckpt" / "training_stats.json"
            lines = p.read_text().split("\n")
            j = json.loads(lines[0])
            m = j["stats"]["metrics"]
            m["loss"] = float(step(np.array([m["loss"]], dtype=np.float32), loss_ulps)[0]) * loss_factor
            m["violators_lhs"] += violators
            lines[0] = json.dumps(j)
            p.write_text("\n".join(lines))
            reseal_manifest(d, "ckpt/training_stats.json")

        return mutate

    def change_tsv(column: int, new: Callable[[str], str]) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            p = d / "export" / "entities.tsv"
            lines = p.read_text().split("\n")
            fields = lines[0].split("\t")
            fields[column] = new(fields[column])
            lines[0] = "\t".join(fields)
            p.write_text("\n".join(lines))
            reseal_manifest(d, "export/entities.tsv")

        return mutate

    def last_digit_up(s: str) -> str:
        v = float(s)
        return "%.9f" % (v + (1e-9 if v >= 0 else -1e-9))

    e = t.expect
    e("pbg", check, fx, "nothing changed", lambda d: None, True)
    e("pbg", check, fx, "one ulp on every embedding of ckpt/embeddings_user_id_0.v4.h5",
      change_dataset("ckpt/embeddings_user_id_0.v4.h5", "embeddings", ONE_ULP), True)
    e("pbg", check, fx, "one ulp on the Adagrad sums in ckpt/model.v4.h5's optimizer blob",
      change_blob_sum("ckpt/model.v4.h5", "state.0.sum"), True)
    e("pbg", check, fx, "embeddings 0.1% larger",
      change_dataset("ckpt/embeddings_user_id_0.v4.h5", "embeddings", BEYOND), False, "largest magnitude")
    e("pbg", check, fx, "one ulp on variants/float64.h5 (not trained)",
      change_dataset("variants/float64.h5", "embeddings", ONE_ULP), False, "variants/float64.h5")
    e("pbg", check, fx, "a loss one ulp off and a ranking count half a count per edge off",
      change_stats(1, 0.5), True)
    e("pbg", check, fx, "a ranking count two counts per edge off", change_stats(0, 2.0), False, "violators_lhs")
    e("pbg", check, fx, "a loss 1% off", change_stats(0, 0.0, 1.01), False, "stats.metrics.loss")
    e("pbg", check, fx, "an exported number in its last digit", change_tsv(1, last_digit_up), True)
    e("pbg", check, fx, "an exported entity renamed", change_tsv(0, lambda s: s + "x"), False, "outside its numbers")
    e("pbg", check, fx, "a missing snapshot link", lambda d: (d / "ckpt" / "epoch_1" / "model.v2.h5").unlink(),
      False, "only in committed")


def hfai_cases(t: Selftest) -> None:
    import hfai_ref
    import torchtree

    fx = FIXTURES / "hfai"
    check = checker("hfai/check_reproducible.py")

    def reseal(d: Path, case: str) -> None:
        exp = json.loads((d / case / "expected.json").read_text("utf-8"))
        tree, tensors, _ = torchtree.render(hfai_ref.load(d / case / "ckpt"))
        exp["tree"], exp["tensors"] = tree, tensors
        write_json(d / case / "expected.json", exp, indent=1, sort_keys=True, ensure_ascii=False)
        s = json.loads((d / "STAMP.json").read_text("utf-8"))
        s["files"] = {n: sha256((d / n).read_bytes()) for n in s["files"]}
        write_json(d / "STAMP.json", s, indent=1, sort_keys=True, ensure_ascii=False)

    def part_tensor(tensor: str, change: Callable) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            p = d / "single_n2" / "ckpt" / "PART_001.pt"
            p.write_bytes(change_tensor(p.read_bytes(), tensor, change))
            reseal(d, "single_n2")

        return mutate

    def loss(factor_ulps: int | None, factor: float = 1.0) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            old = hfai_ref.load(d / "single_n2" / "ckpt")["loss"]
            new = float(step(np.array([old]), factor_ulps)[0]) if factor_ulps else old * factor
            for rel in ("single_n2/ckpt/PART_000.pt", "single_n2/source.pt"):
                (d / rel).write_bytes(change_pickle_float((d / rel).read_bytes(), old, new))
            reseal(d, "single_n2")

        return mutate

    def gamma(d: Path) -> None:
        p = d / "single_n2" / "ckpt" / "PART_000.pt"
        p.write_bytes(change_pickle_float(p.read_bytes(), 0.5, float(np.nextafter(0.5, 1.0))))
        reseal(d, "single_n2")

    trained = "model.0.0.module.head.weight"
    e = t.expect
    e("hfai", check, fx, "nothing changed", lambda d: None, True)
    e("hfai", check, fx, f"one ulp on every element of {trained} in a part", part_tensor(trained, ONE_ULP), True)
    e("hfai", check, fx, "one ulp on the bfloat16 SGD momentum in a part",
      lambda d: (lambda p: (p.write_bytes(change_tensor(p.read_bytes(), "optimizer.1.0.state.1.momentum_buffer", ONE_ULP)),
                            reseal(d, "multi_n2")))(d / "multi_n2" / "ckpt" / "PART_001.pt"), True)
    e("hfai", check, fx, f"{trained} 0.1% larger", part_tensor(trained, BEYOND), False, "largest magnitude")
    e("hfai", check, fx, "the loss one ulp off", loss(1), True)
    e("hfai", check, fx, "the loss 1% off", loss(None, 1.01), False, "value loss")
    e("hfai", check, fx, "the scheduler's gamma one ulp off (not trained)", gamma, False, "differs")


def distcp_cases(t: Selftest) -> None:
    import torchtree

    fx = FIXTURES / "distcp" / "torch213"
    check = checker("distcp/check_reproducible.py")

    def change_item(case: str, key: str, change: Callable) -> Callable[[Path], None]:
        def mutate(d: Path) -> None:
            p = d / case / "__0_0.distcp"
            data = bytearray(p.read_bytes())
            for fqn, off, n in R.dcp_items(d / case / ".metadata", p.name):
                if fqn == key:
                    data[off : off + n] = change_tensor(bytes(data[off : off + n]), "", change)
            p.write_bytes(bytes(data))
            m = json.loads((d / f"{case}.json").read_text())
            for entry in m["entries"]:
                if entry["key"] == key:
                    entry["sha256"] = torchtree.tensor_sha256(R.dcp_item_tensor(p, key))
            m["files"][p.name] = sha256(p.read_bytes())
            (d / f"{case}.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
            s = json.loads((d / "STAMP.json").read_text())
            s["files"][case][p.name] = sha256(p.read_bytes())
            (d / "STAMP.json").write_text(json.dumps(s, indent=1, sort_keys=True) + "\n")

        return mutate

    e = t.expect
    e("distcp", check, fx, "nothing changed", lambda d: None, True)
    e("distcp", check, fx, "one ulp on s_optim's optim.state.1.exp_avg",
      change_item("s_optim", "optim.state.1.exp_avg", ONE_ULP), True)
    e("distcp", check, fx, "s_optim's model.0.weight 0.1% larger",
      change_item("s_optim", "model.0.weight", BEYOND), False, "largest magnitude")
    e("distcp", check, fx, "one ulp on s_mixed's big (not trained)",
      change_item("s_mixed", "big", ONE_ULP), False, "s_mixed")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="selftest-reproducible-") as td:
        t = Selftest(Path(td))
        for cases in (torch_cases, pbg_cases, hfai_cases, distcp_cases):
            cases(t)
    for f in t.failures:
        print(f"SELFTEST FAILURE: {f}")
    print(f"selftest {'FAILED' if t.failures else 'passed'}: {t.count} cases, {len(t.failures)} failure(s)")
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks RecIS checkpoints written by ckpt (Rust) with Python, from the loader rules of specs/recis.md.

Usage: check_recis.py JOB.json

JOB.json:
  {"checkpoints": [{"name": N, "dir": D, "writer_rules": bool, "expect_error": text (optional)}],
   "reshards":    [{"name": N, "dir": D, "shards": S, "compare_dir": D2 or null, "expect_error": ...}],
   "torch_files": [{"name": N, "path": P, "expect": {flat key: summary}}]}

For every checkpoint directory it
  * parses tensorkey.json and index, resolves every block key through tensorkey.json, splits internal block
    names on "^" and slice strings on "@" (specs/recis.md section 14, written here independently of the Rust
    code);
  * opens every data file with the Hugging Face `safetensors` library (safe_open and load_file) and checks
    that each tensor's bytes are the bytes at 8 + N + data_offsets in the file;
  * with writer_rules, checks RecIS's writer rules: N % 8 == 0 with 1..8 trailing spaces, compact JSON in
    which every entry is exactly {dtype, shape, data_offsets} with cumulative offsets, no __metadata__, no
    lower-case "bool"; `index` is compact sorted JSON, tensorkey.json is json.dumps(indent=4, sort_keys=True);
  * dumps tables (id -> slot -> row hex), tables per writing shard, dense tensors and tensor names.

For every reshard it computes, for each target shard r of S, the ids x of every table with
(x mod 2**64) % slice_size in gen_slice(r, S, slice_size) -- RecIS's loader rule -- from every source slice,
and, given compare_dir (a checkpoint resharded by Rust), asserts that shard r of it holds exactly that, under
slice string gen_slice(r, S).

For every torch file it runs torch.load(weights_only=True) and compares a flattened summary with "expect".

An entry with "expect_error" is a self-test of the checker: it must be rejected with that text (listed under
"rejected" in the output). Prints one JSON object with everything it computed; exits non-zero on the first
violated rule, or when an entry meant to be rejected is accepted.
"""

import json
import os
import struct
import sys
from collections import OrderedDict

import safetensors
import safetensors.torch
import torch
from safetensors import safe_open

WRITER_DTYPES = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}
TORCH_DTYPE_NAMES = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}


class CheckError(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CheckError(msg)


def tensor_bytes(t):
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def gen_slice(index, num, size):
    base, rem = divmod(size, num)
    begin = index * base + min(index, rem)
    end = begin + base + (1 if index < rem else 0)
    return begin, end


def slice_string(begin, end, size):
    w = len(str(size))
    return f"{begin:0{w}d}@{end:0{w}d}@{size}"


def parse_slice(s):
    parts = s.split("@")
    check(len(parts) == 3 and all(p.isdigit() for p in parts), f"bad slice string {s!r}")
    b, e, z = (int(p) for p in parts)
    check(0 <= b <= e <= z and z > 0, f"bad slice range {s!r}")
    return b, e, z


def read_header(path):
    with open(path, "rb") as f:
        data = f.read()
    check(len(data) >= 8, f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    check(8 + n <= len(data), f"{path}: header length {n} past the end")
    text = data[8:8 + n].decode("utf-8")
    header = json.loads(text, object_pairs_hook=OrderedDict)
    return data, n, text, header


def check_writer_rules(path, data, n, text, header):
    check(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
    raw = data[8:8 + n]
    body_bytes = raw.rstrip(b" ")
    pad = len(raw) - len(body_bytes)
    check(1 <= pad <= 8, f"{path}: {pad} padding spaces, RecIS writes 1..8")
    check(pad == 8 - len(body_bytes) % 8, f"{path}: padding {pad} for a {len(body_bytes)}-byte JSON")
    body = body_bytes.decode("utf-8")
    compact = json.dumps(header, separators=(",", ":"), ensure_ascii=False)
    check(compact == body, f"{path}: header is not compact insertion-ordered JSON:\n{body}\n{compact}")
    check("__metadata__" not in header, f"{path}: has __metadata__")
    offset = 0
    for key, entry in header.items():
        check(list(entry.keys()) == ["dtype", "shape", "data_offsets"], f"{path}: {key}: keys {list(entry)}")
        check(entry["dtype"] in WRITER_DTYPES, f"{path}: {key}: dtype {entry['dtype']!r}")
        b, e = entry["data_offsets"]
        check(b == offset, f"{path}: {key}: offsets not cumulative ({b} after {offset})")
        offset = e
    check(offset == len(data) - 8 - n, f"{path}: blocks end at {offset}, data region is {len(data) - 8 - n}")


def load_checkpoint(d, writer_rules):
    with open(os.path.join(d, "tensorkey.json"), "rb") as f:
        tk_text = f.read().decode("utf-8")
    with open(os.path.join(d, "index"), "rb") as f:
        index_text = f.read().decode("utf-8")
    tensorkey = json.loads(tk_text)
    index = json.loads(index_text)
    if writer_rules:
        check(index_text == json.dumps(index, separators=(",", ":"), sort_keys=True, ensure_ascii=False),
              f"{d}: index is not compact sorted JSON")
        check(tk_text == json.dumps(tensorkey, indent=4, sort_keys=True, ensure_ascii=False),
              f"{d}: tensorkey.json is not dump(4) with sorted keys")
    files = {fid: name for name, fid in index["file_index"].items()}
    check(len(files) == len(index["file_index"]), f"{d}: duplicate file ids")

    # Every data file: the safetensors library reads it, and its tensors are the bytes the header points at.
    file_tensors = {}
    for fid, name in sorted(files.items()):
        path = os.path.join(d, name)
        data, n, text, header = read_header(path)
        if writer_rules:
            check_writer_rules(path, data, n, text, header)
        loaded = safetensors.torch.load_file(path)
        tensors = {}
        with safe_open(path, framework="pt") as f:
            check(set(f.keys()) == set(k for k in header if k != "__metadata__"), f"{path}: keys differ")
            for key in f.keys():
                t = f.get_tensor(key)
                b, e = header[key]["data_offsets"]
                raw = data[8 + n + b:8 + n + e]
                check(tensor_bytes(t) == raw, f"{path}: {key}: safetensors bytes differ from the file")
                check(tensor_bytes(loaded[key]) == raw, f"{path}: {key}: load_file differs")
                tensors[key] = t
        file_tensors[fid] = tensors

    # Blocks, through tensorkey.json (specs/recis.md section 14).
    groups = {}  # (child, slice string) -> {"id": tensor, slot: tensor}
    shard_of = {}  # (child, slice string) -> shard index from the part name
    dense = {}
    tensor_names = set()
    for key, fid in index["block_index"].items():
        check(fid in file_tensors, f"{d}: block {key} in unknown file id {fid}")
        check(key in file_tensors[fid], f"{d}: block {key} missing from {files[fid]}")
        t = file_tensors[fid][key]
        internal = tensorkey.get(key, key)
        tokens = [x for x in internal.split("^") if x]
        check(len(tokens) == 2, f"{d}: block name {internal!r} is not tensor^slice")
        tensor, sl = tokens
        tensor_names.add(tensor)
        if sl == " ":
            dense[tensor] = {"dtype": TORCH_DTYPE_NAMES[t.dtype], "shape": list(t.shape), "hex": tensor_bytes(t).hex()}
            continue
        parse_slice(sl)
        child, slot = tensor.rsplit("@", 1)
        groups.setdefault((child, sl), {})[slot] = t
        if "/part_" in key:
            shard_of[(child, sl)] = int(key.rsplit("/part_", 1)[1].split("_")[0])

    tables = {}
    shards = {}
    for (child, sl), blocks in sorted(groups.items()):
        check("id" in blocks, f"{d}: {child} {sl} has no id block")
        ids = blocks["id"].tolist()
        slots = {k: v for k, v in blocks.items() if k != "id"}
        check(slots, f"{d}: {child} {sl} has no slot block")
        size = parse_slice(sl)[2]
        table = tables.setdefault(child, {"slice_size": size, "slots": sorted(slots), "rows": {}})
        check(table["slice_size"] == size, f"{d}: {child}: slices with different sizes")
        check(table["slots"] == sorted(slots), f"{d}: {child}: slices with different slots")
        per_shard = shards.setdefault(str(shard_of.get((child, sl), -1)), {}).setdefault(child, {"slice": sl, "rows": {}})
        for slot, t in slots.items():
            check(t.shape[0] == len(ids), f"{d}: {child}@{slot} {sl}: {t.shape[0]} rows for {len(ids)} ids")
        for k, x in enumerate(ids):
            row = {slot: tensor_bytes(t[k]) .hex() for slot, t in slots.items()}
            check(str(x) not in table["rows"], f"{d}: {child}: id {x} twice")
            table["rows"][str(x)] = row
            per_shard["rows"][str(x)] = row
    return {
        "tables": tables,
        "shards": shards,
        "dense": dense,
        "tensor_names": sorted(tensor_names),
        "files": sorted(files.values()),
    }


def reshard(ckpt, shards):
    """What each target shard loads: RecIS's loader rule over every source slice."""
    out = []
    for r in range(shards):
        part = {}
        for child, table in ckpt["tables"].items():
            size = table["slice_size"]
            b, e = gen_slice(r, shards, size)
            rows = {x: row for x, row in table["rows"].items() if b <= (int(x) % (1 << 64)) % size < e}
            part[child] = {"slice": slice_string(b, e, size), "rows": rows}
        out.append(part)
    return out


def check_reshard(r, loaded):
    """The loader rule on r["dir"]; with compare_dir, that directory must hold exactly that, shard by shard."""
    src = loaded.get(r["dir"]) or load_checkpoint(r["dir"], True)
    parts = reshard(src, r["shards"])
    if r.get("compare_dir"):
        dst = loaded.get(r["compare_dir"]) or load_checkpoint(r["compare_dir"], True)
        for i, part in enumerate(parts):
            got = dst["shards"].get(str(i), {})
            for child, want in part.items():
                check(child in got, f"shard {i} lacks table {child}")
                check(got[child] == want, f"shard {i} table {child} differs from the loader rule:"
                                          f" {len(got[child]['rows'])} rows under {got[child]['slice']},"
                                          f" expected {len(want['rows'])} under {want['slice']}")
        check(dst["dense"] == src["dense"], "dense tensors differ")
    return parts


def flatten(obj, prefix=""):
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    key = prefix[:-1]
    if isinstance(obj, torch.Tensor):
        out[key] = {"dtype": TORCH_DTYPE_NAMES.get(obj.dtype, str(obj.dtype)), "shape": list(obj.shape),
                    "hex": tensor_bytes(obj).hex()}
    else:
        out[key] = {"py": repr(obj)}
    return out


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    result = {"versions": {"torch": torch.__version__, "safetensors": safetensors.__version__},
              "checkpoints": {}, "reshards": {}, "torch_files": {}}
    result["rejected"] = {}
    loaded = {}

    def expecting(entry, what, fn):
        """Runs fn; an entry with "expect_error" must fail with that text (the checker's self-test)."""
        want = entry.get("expect_error")
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - the safetensors library raises its own errors
            if want is not None and want in str(e):
                result["rejected"][entry["name"]] = str(e)
                return None
            raise SystemExit(f"{what} {entry['name']}: {e}")
        if want is not None:
            raise SystemExit(f"{what} {entry['name']}: accepted, expected an error containing {want!r}")
        return value

    for c in job.get("checkpoints", []):
        value = expecting(c, "checkpoint", lambda: load_checkpoint(c["dir"], c.get("writer_rules", True)))
        if value is not None:
            loaded[c["dir"]] = value
            result["checkpoints"][c["name"]] = value
    for r in job.get("reshards", []):
        parts = expecting(r, "reshard", lambda: check_reshard(r, loaded))
        if parts is not None:
            result["reshards"][r["name"]] = parts
    for t in job.get("torch_files", []):
        obj = torch.load(t["path"], weights_only=True)
        flat = flatten(obj)
        result["torch_files"][t["name"]] = flat
        if flat != t["expect"]:
            raise SystemExit(f"torch file {t['name']}: loaded {json.dumps(flat)[:2000]}\nexpected "
                             f"{json.dumps(t['expect'])[:2000]}")
    json.dump(result, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    try:
        main()
    except CheckError as e:
        raise SystemExit(str(e))

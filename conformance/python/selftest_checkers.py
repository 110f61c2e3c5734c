#!/usr/bin/env python3
"""Self-test: the round-trip and load checkers must catch known-bad candidates.

Usage::

    .venv/bin/python conformance/python/selftest_checkers.py [FIXTURE_DIR]

FIXTURE_DIR defaults to ``conformance/fixtures/torch``. Builds deliberately wrong candidates in a
temporary directory (container type changed, key order changed, a NaN replaced, storage sharing
broken, a view re-based, requires_grad flipped, records re-zipped by Python's ``zipfile`` while
keeping ``.format_version``) and runs ``check_roundtrip.py`` / ``check_loads.py`` on them as
subprocesses. Every bad candidate must be rejected with the expected message, every fixture
compared with itself must pass. Exit status 0 when all expectations hold, 1 otherwise.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import zipfile
from collections import OrderedDict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchtree import normalize_sets  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_FIXTURES = HERE.parent / "fixtures" / "torch"


def run(script: str, *args: str) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, str(HERE / script), *args], capture_output=True, text=True, encoding="utf-8", check=False
    )
    return p.returncode, p.stdout + p.stderr


def rezip_with_python_zipfile(src: Path, dst: Path) -> None:
    """Copy every record (same names, incl. .format_version) into a Python-zipfile layout."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zout.writestr(zi, zin.read(info.filename))


def main(argv: list[str]) -> int:
    fx = Path(argv[1]) if len(argv) > 1 else DEFAULT_FIXTURES
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        bad: list[tuple[str, Path, Path, str]] = []  # (what, original, candidate, expected text)

        def cand(name: str, obj: object, original: str, expect: str, what: str) -> None:
            p = tmp / f"{name}.pt"
            torch.save(obj, str(p))
            bad.append((what, fx / original, p, expect))

        module = torch.load(str(fx / "module.pt"), weights_only=True)
        cand("module_as_dict", dict(module), "module.pt", "type collections.OrderedDict in original",
             "OrderedDict saved as dict")
        no_meta = OrderedDict(module)
        cand("module_no_metadata", no_meta, "module.pt", "__dict__", "OrderedDict without _metadata")
        sd = torch.load(str(fx / "contiguous_sd.pt"), weights_only=True)
        cand("sd_reordered", dict(reversed(list(sd.items()))), "contiguous_sd.pt", "keys differ", "key order changed")
        dt = torch.load(str(fx / "dtypes.pt"), weights_only=True)
        dt2 = dict(dt)
        f32 = dt["float32"].clone()
        f32[2, 3] = 0.0  # was NaN
        dt2["float32"] = f32
        cand("dtypes_nan_lost", dt2, "dtypes.pt", "values differ", "a NaN replaced by 0")
        dt3 = dict(dt)
        dt3["float16"] = dt["float16"].to(torch.float32)
        cand("dtypes_widened", dt3, "dtypes.pt", "dtype", "float16 written as float32")
        views = torch.load(str(fx / "views.pt"), weights_only=True)
        cand("views_cloned", {k: v.clone() for k, v in views.items()}, "views.pt", "",
             "views materialised (strides/offsets/sharing lost)")
        v2 = dict(views)
        v2["a_cols"] = views["a"].clone()[:, 1:]  # same strides/offset/values, own storage
        cand("views_unshared", v2, "views.pt", "shares its storage", "one view given its own storage")
        shared = torch.load(str(fx / "shared.pt"), weights_only=True)
        s2 = dict(shared)
        s2["dec.weight"] = shared["dec.weight"].clone()
        cand("shared_untied", s2, "shared.pt", "shares its storage", "tied weight untied")
        par = torch.load(str(fx / "parameter.pt"), weights_only=True)
        p2 = dict(par)
        p2["param"] = torch.nn.Parameter(par["param"].detach().clone(), requires_grad=False)
        p2["param_again"] = [p2["param"]]
        cand("param_flag", p2, "parameter.pt", "requires_grad", "Parameter requires_grad flipped")
        p3 = dict(par)
        p3["param_frozen"] = par["param_frozen"].detach()
        cand("param_plain", p3, "parameter.pt", "torch.nn.parameter.Parameter in original", "Parameter saved as Tensor")
        nested = torch.load(str(fx / "nested.pt"), weights_only=True)
        n2 = dict(nested)
        n2["floats"] = list(nested["floats"])
        n2["floats"][4] = 0.0  # was -0.0
        cand("nested_zero_sign", n2, "nested.pt", "value -0.0", "-0.0 written as 0.0")
        n3 = dict(nested)
        n3["nested"] = {"a": list(nested["nested"]["a"]), "b": nested["nested"]["b"]}
        n3["nested"]["a"][2] = list(n3["nested"]["a"][2])
        cand("nested_tuple_as_list", n3, "nested.pt", "type builtins.tuple", "tuple written as list")

        rz = tmp / "views_rezipped.pt"
        rezip_with_python_zipfile(fx / "views.pt", rz)
        bad.append(("re-zipped by Python zipfile, .format_version kept", fx / "views.pt", rz,
                    "mmap+calculate_storage_offsets+debug"))

        # bad candidates, one process
        args: list[str] = []
        for _, o, c, _ in bad:
            args += [str(o), str(c)]
        rc, out = run("check_roundtrip.py", "--pairs", *args)
        if rc != 1:
            failures.append(f"check_roundtrip on bad candidates exited {rc}, expected 1")
        for what, _, c, expect in bad:
            lines = [ln for ln in out.splitlines() if ln.startswith("FAIL") and f"{c} vs" in ln]
            if not lines:
                failures.append(f"not rejected: {what} ({c.name})")
            elif expect and not any(expect in ln for ln in lines):
                failures.append(f"rejected for another reason: {what}: {lines[0]}")
            else:
                print(f"rejected as expected: {what}: {lines[0][:160]}")

        # identity warning
        s3 = dict(shared)
        s3["dec.weight"] = shared["enc.weight"].detach()
        p = tmp / "shared_identity.pt"
        torch.save(s3, str(p))
        rc, out = run("check_roundtrip.py", str(fx / "shared.pt"), str(p))
        if rc != 0 or "warning" not in out:
            failures.append(f"identity loss should warn and pass: rc={rc} {out[-300:]}")
        rc, out = run("check_roundtrip.py", "--strict-identity", str(fx / "shared.pt"), str(p))
        if rc != 1:
            failures.append("identity loss should fail with --strict-identity")

        # every fixture against itself, with its manifest
        batch = [
            {"original": str(f), "candidate": str(f), "manifest": str(f.with_suffix(".json"))}
            for f in sorted(fx.glob("*.pt"))
        ]
        bf = tmp / "pairs.json"
        bf.write_text(json.dumps(batch), encoding="utf-8")
        rc, out = run("check_roundtrip.py", "--batch", str(bf))
        if rc != 0:
            failures.append(f"fixtures vs themselves failed:\n{out}")
        else:
            print(out.splitlines()[-1])

        # check_loads: its tensor records must equal the manifests' (keys included)
        zips = [f for f in sorted(fx.glob("*.pt")) if json.loads(f.with_suffix(".json").read_text())["torch_load"]["mmap"]]
        rc, out = run("check_loads.py", *map(str, zips))
        if rc != 0:
            failures.append(f"check_loads failed on fixtures: {out[-500:]}")
        else:
            doc = json.loads(out)
            for r in doc["files"]:
                m = json.loads(Path(r["file"]).with_suffix(".json").read_text(encoding="utf-8"))
                # set items: the manifest has the pickle's order, check_loads the loaded set's
                same_tree = normalize_sets(r["tree"]) == normalize_sets(m["tree"])
                if r["tensors"] != m["tensors"] or not same_tree:
                    failures.append(f"check_loads output differs from manifest for {r['file']}")
            print(f"check_loads agrees with {len(doc['files'])} manifests")
        rc, out = run("check_loads.py", str(rz))
        if rc != 0:
            failures.append("check_loads should accept the re-zipped views (plain mmap reads local headers)")
        junk = tmp / "junk.pt"
        junk.write_bytes(io.BytesIO(b"<!DOCTYPE html><html></html>").getvalue())
        rc, out = run("check_loads.py", str(junk))
        if rc != 1:
            failures.append("check_loads should reject an HTML page")

    for f in failures:
        print(f"SELFTEST FAILURE: {f}")
    print("selftest " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

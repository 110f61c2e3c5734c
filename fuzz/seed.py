#!/usr/bin/env python3
"""Builds raw seed corpora for the fuzz targets from the golden fixtures (Python standard library only).

    python3 fuzz/seed.py OUT_DIR

writes OUT_DIR/<target>/<sha1> for every target. Directory checkpoints become file-set inputs
(fuzz/src/lib.rs: each file is b"\\xff\\x00CKF:" + name + b"\\n" + bytes; bytes before the first
separator carry the target's default name). scripts/fuzz.sh --reseed minimizes these into
fuzz/corpus/<target> with `cargo fuzz cmin`.
"""

import hashlib
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SEP = b"\xff\x00CKF:"
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "conformance" / "fixtures"
SOURCES = [FIXTURES, ROOT / "conformance" / "bad", ROOT / "crates" / "torch" / "tests",
           Path("/work/shared/golden")]
# Files bigger than this are left out of the seeds (libFuzzer works best on small inputs).
MAX_SEED = 128 * 1024


def files_under(*roots, suffix=None):
    for root in roots:
        if root.is_dir():
            for p in sorted(root.rglob("*")):
                if p.is_file() and (suffix is None or p.name.endswith(suffix)):
                    yield p


def file_set(head_name, files):
    """files: [(name, bytes)]; the file called head_name goes first, without a separator."""
    out = b""
    head = [b for n, b in files if n == head_name]
    if head:
        out += head[0]
    for name, data in files:
        if name != head_name:
            out += SEP + name.encode() + b"\n" + data
    return out


def dir_files(d, depth=2):
    out = []
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d)
        if p.is_file() and len(rel.parts) <= depth and not p.name.endswith((".md", "STAMP.json")):
            out.append((str(rel), p.read_bytes()))
    return out[:16]


class Seeds:
    def __init__(self, out):
        self.out = Path(out)

    def add(self, target, data):
        if not data or len(data) > MAX_SEED:
            return
        d = self.out / target
        d.mkdir(parents=True, exist_ok=True)
        (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def zip_members(p):
    try:
        with zipfile.ZipFile(p) as z:
            return [(i.filename, z.read(i)) for i in z.infolist()]
    except Exception:
        return []


# Legacy (torch < 1.6 format) saves, made with the project's torch when .venv has it: the fixtures hold one.
LEGACY_SCRIPT = """
import collections, io, sys, torch
torch.manual_seed(0)
t = torch.arange(12.).reshape(3, 4)
objs = {
    'sd': collections.OrderedDict(w=torch.randn(3, 4), b=torch.zeros(4, dtype=torch.float64)),
    'dtypes': {str(d): torch.ones(2, dtype=d) for d in [torch.uint8, torch.int8, torch.int16, torch.int32,
               torch.int64, torch.float16, torch.bfloat16, torch.bool, torch.complex64]},
    'views': {'t': t, 'v': t[1:, ::2], 'tt': t.t()},
    'param': {'p': torch.nn.Parameter(torch.randn(2)), 'n': 3, 's': 'x', 'l': [1, 2.5, None, (True,)]},
    'optim': torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9).state_dict(),
    'empty': {},
}
for name, o in objs.items():
    with open(sys.argv[1] + '/' + name + '.pt', 'wb') as f:
        torch.save(o, f, _use_new_zipfile_serialization=False)
"""


def legacy_saves():
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        return []
    with tempfile.TemporaryDirectory() as d:
        if subprocess.run([str(python), "-c", LEGACY_SCRIPT, d], capture_output=True).returncode != 0:
            return []
        return [p.read_bytes() for p in sorted(Path(d).iterdir())]


def main(out):
    s = Seeds(out)
    torch_files = [p for p in files_under(*SOURCES) if p.suffix in (".pt", ".pth", ".bin")]

    # pickle: every pickle in the fixtures (data.pkl records, DCP metadata, legacy streams).
    for p in torch_files:
        for name, data in zip_members(p):
            if name.endswith(".pkl"):
                s.add("pickle", data)
    for p in files_under(*SOURCES, suffix=".metadata"):
        s.add("pickle", p.read_bytes())
    s.add("pickle", (FIXTURES / "torch" / "legacy.pt").read_bytes())
    for data in legacy_saves():
        s.add("torch_legacy", data)
        s.add("pickle", data)

    # torch_zip / torch_legacy: whole torch.save files.
    for p in torch_files:
        data = p.read_bytes()
        s.add("torch_legacy" if data[:2] == b"\x80\x02" else "torch_zip", data)
    for p in files_under(ROOT / "crates" / "torch" / "tests" / "zipdata"):
        s.add("torch_zip", p.read_bytes())

    # pickle_file / torch_package: the plain pickles; the torch.package archives and their resources.
    for p in files_under(FIXTURES / "pickle", suffix=".pkl"):
        s.add("pickle_file", p.read_bytes())
    for p in files_under(FIXTURES / "package", suffix=".pt"):
        s.add("torch_package", p.read_bytes())
        for name, data in zip_members(p):
            if name.endswith(".pkl"):
                s.add("torch_package", data)

    # Directory formats: one file-set per checkpoint directory.
    distcp_dirs = sorted({p.parent for p in files_under(*SOURCES) if p.name.endswith(".metadata")
                          or p.name == "model.safetensors.index.json" or p.name.startswith("shard-")})
    for d in distcp_dirs:
        data = file_set(".metadata", dir_files(d))
        s.add("distcp", data)
        s.add("open_dir", data)
    recis_dirs = sorted({p.parent for p in files_under(*SOURCES) if p.name == "tensorkey.json"})
    for d in recis_dirs:
        data = file_set("index", dir_files(d))
        s.add("recis", data)
        s.add("open_dir", data)
    hfai_dirs = sorted({p.parent for p in files_under(*SOURCES) if p.name == "PART_000.pt"})
    for d in hfai_dirs:
        data = file_set("PART_000.pt", dir_files(d))
        s.add("hfai", data)
        s.add("open_dir", data)
    rng = random.Random(12)
    for n in (64, 256, 1024, 4096):
        s.add("hfai", b"S" + bytes(rng.randrange(256) for _ in range(n)))

    # PBG: the checkpoint directory (HDF5 files are defused by the target), the entity files, configs,
    # root attributes as `attrs` lines, optimizer state dicts as `.blob` files, each bad file alone.
    pbg = FIXTURES / "pbg"
    config = (pbg / "config.json").read_bytes()
    attrs = (b"format_version=1\nconfig/json=" + b" ".join(config.split()) +
             b"\niteration/num_epochs=3\niteration/epoch_idx=1\niteration/num_edge_paths=1\n"
             b"iteration/edge_path_idx=0\niteration/edge_path=data/edges\niteration/num_edge_chunks=2\n"
             b"iteration/edge_chunk_idx=1\n")
    ck = pbg / "ckpt"
    small = [(n, b) for n, b in dir_files(ck, depth=1) if not n.endswith(".h5")]
    version = (ck / "checkpoint_version.txt").read_bytes()
    h5 = sorted(p for p in ck.glob("*.h5"))
    data_files = [(p.name, p.read_bytes()) for p in sorted((pbg / "data").glob("entity_*"))]
    for p in h5:
        files = small + [(p.name, p.read_bytes())]
        s.add("pbg", file_set("checkpoint_version.txt", files))
    s.add("pbg", file_set("checkpoint_version.txt", small + data_files + [("attrs", attrs)]))
    s.add("open_dir", file_set("checkpoint_version.txt", small + [(h5[0].name, h5[0].read_bytes())]))
    for name in ("optim_adagrad.pt", "optim_sgd.pt", "optim_adam.pt", "legacy.pt"):
        s.add("pbg", file_set("checkpoint_version.txt", [("checkpoint_version.txt", version),
                                                         ("optimizer.blob", (FIXTURES / "torch" / name).read_bytes())]))
    for p in files_under(pbg / "bad", pbg / "variants", suffix=".h5"):
        s.add("pbg", file_set("checkpoint_version.txt", [("checkpoint_version.txt", version),
                                                         ("embeddings_user_0.v" + version.strip().decode() + ".h5",
                                                          p.read_bytes())]))

    # open_dir: single files too (torch, legacy, safetensors), as the tool opens them.
    for p in torch_files:
        s.add("open_dir", p.read_bytes())
    for p in files_under(*SOURCES, suffix=".safetensors"):
        s.add("open_dir", p.read_bytes())

    for t in sorted(p.name for p in Path(out).iterdir()):
        n = list((Path(out) / t).iterdir())
        print(f"{t}: {len(n)} seeds, {sum(f.stat().st_size for f in n)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

"""Every class of message the package gives over what is not right, as a table: input, exception type and
the words the message must hold, with the path named once. A file that is not a checkpoint says what it looks
like, a directory without marker lists the markers looked for and the keyword that names a format, a truncated
file says so, a special file is refused at once (a hang fails the test), a missing entry gets a did-you-mean
and a prefix of entries gives the sub-tree; dtype arguments take numpy and torch dtypes; ``diff`` says how
values differ, in ``str(report)`` and structured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Type

import numpy as np
import pytest

import ckpt

FIXTURES = Path(__file__).resolve().parents[2] / "conformance" / "fixtures"
README = Path(__file__).resolve().parents[2] / "README.md"
D215 = FIXTURES / "distcp" / "golden" / "d215"
LIGHTNING = FIXTURES / "values" / "lightning.ckpt"


def _small(tmp: Path) -> "tuple[Path, Path]":
    sd = {"w": np.arange(4, dtype=np.float32).reshape(2, 2), "step": 3}
    pt, st = tmp / "ok.pt", tmp / "ok.safetensors"
    ckpt.save(sd, pt, "torch")
    ckpt.save({"w": sd["w"]}, st, "safetensors")
    return pt, st


def _cut(src: Path, dst: Path, keep: Callable[[int], int]) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[:keep(len(data))])
    return dst


def _cases(tmp: Path) -> "List[tuple[str, Path, Type[BaseException], List[str]]]":
    pt, st = _small(tmp)
    (tmp / "empty.pt").write_bytes(b"")
    (tmp / "config.json").write_bytes(b'{"a": 1}')
    (tmp / "notes").mkdir()
    (tmp / "notes" / "notes.txt").write_text("hello")
    (tmp / "empty_dir").mkdir()
    return [
        ("a text file", README, ckpt.MalformedError,
         ["not a checkpoint", 'this is a text file (starts with "# ckpt")', "format="]),
        ("an empty file", tmp / "empty.pt", ckpt.MalformedError, ["this is an empty file"]),
        ("a JSON file", tmp / "config.json", ckpt.MalformedError, ["this is a JSON file"]),
        ("a directory without marker", tmp / "notes", ckpt.MalformedError,
         ["no marker file in the directory", ".metadata", "PART_*.pt (hfai)", "model.safetensors.index.json",
          "format="]),
        ("an empty directory", tmp / "empty_dir", ckpt.MalformedError, ["the directory is empty", "looked for"]),
        ("a truncated .pt", _cut(pt, tmp / "cut.pt", lambda n: n - 30), ckpt.MalformedError,
         ["the file is truncated"]),
        ("a safetensors file cut in its header", _cut(st, tmp / "head.safetensors", lambda n: 40),
         ckpt.MalformedError, ["runs past the end", "the file is truncated"]),
        ("a safetensors file cut in its data", _cut(st, tmp / "data.safetensors", lambda n: n - 4),
         ckpt.BadInputError, ["the file is truncated?"]),
        ("a truncated GGUF file", _cut(FIXTURES / "gguf" / "metadata.gguf", tmp / "cut.gguf", lambda n: n // 2),
         ckpt.MalformedError, ["truncated"]),
    ]


def test_every_message_class_names_the_path_once(tmp_path: Path) -> None:
    for what, path, kind, says in _cases(tmp_path):
        with pytest.raises(kind) as info:
            ckpt.open(path).entries
        message = str(info.value)
        for s in says:
            assert s in message, f"{what}: {s!r} not in {message}"
        assert message.count(str(path)) == 1, f"{what}: {path} not named once in {message}"
        assert info.value.path == str(path), what


def test_a_file_read_as_a_declared_format_says_what_it_looks_like() -> None:
    with pytest.raises(ckpt.MalformedError) as info:
        ckpt.open(README, format="torch")
    assert 'this is a text file (starts with "# ckpt")' in str(info.value)
    assert str(info.value).count(str(README)) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_special_files_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # In a child process with a timeout: a hang fails the test instead of blocking it.
    code = (
        "import sys, ckpt\n"
        "for call in (lambda p: ckpt.open(p), lambda p: ckpt.open(p, format='torch'), ckpt.detect,\n"
        "             lambda p: ckpt.convert(p, p + '.out.pt', 'torch', from_='torch'), lambda p: ckpt.verify(p)):\n"
        "    try:\n"
        "        call(sys.argv[1])\n"
        "    except ckpt.UsageError as e:\n"
        "        assert 'this is a named pipe (FIFO), not a checkpoint file or directory' in str(e), e\n"
        "        assert str(e).count(sys.argv[1]) == 1, e\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr


def test_missing_entries_suggest_names_and_prefixes_give_the_sub_tree() -> None:
    ck = ckpt.open(D215)
    for call in (lambda: ck["ro"], lambda: ck.tensor("ro"), lambda: ck.value("ro"), lambda: ck.entry("ro")):
        with pytest.raises(ckpt.EntryNotFoundError) as info:
            call()
        assert isinstance(info.value, KeyError)
        assert "no entry 'ro'; did you mean: row?" in str(info.value)
        assert str(info.value).count(str(D215)) == 1
    lightning = ckpt.open(LIGHTNING)
    with pytest.raises(KeyError, match="did you mean: state_dict"):
        lightning["state_dic"]
    # A prefix: every entry under it, by the rest of its name.
    sub = lightning["state_dict"]
    under = [n for n in lightning.keys() if n.startswith("state_dict.")]
    assert isinstance(sub, dict) and list(sub) == [n[len("state_dict."):] for n in under]
    for n in under:
        np.testing.assert_array_equal(np.asarray(sub[n[len("state_dict."):]]), np.asarray(lightning[n]))
    # A prefix is no tensor: ck.tensor says what is under it.
    with pytest.raises(ckpt.EntryNotFoundError, match=f"{len(under)} entries are under it"):
        lightning.tensor("state_dict")


def test_dtype_arguments_take_numpy_and_torch_dtypes(tmp_path: Path) -> None:
    src = tmp_path / "src.pt"
    ckpt.save({"w": np.arange(4, dtype=np.float32)}, src, "torch")
    torch = pytest.importorskip("torch")
    for i, dtype in enumerate(["float16", np.float16, np.dtype("float16"), torch.float16, "bf16", torch.bfloat16]):
        out = tmp_path / f"out{i}.safetensors"
        ckpt.convert(src, out, "safetensors", dtype=dtype)
        want = "bfloat16" if "bf" in str(dtype) else "float16"
        assert ckpt.open(out).entry("w").dtype == want, dtype
    with pytest.raises(TypeError, match=r"dtype=3: expected a dtype name .*numpy dtype.*torch dtype"):
        ckpt.convert(src, tmp_path / "bad.safetensors", "safetensors", dtype=3)


def test_diff_report_holds_the_values_and_reads_as_the_cli(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    w2 = w.copy()
    w2[1, 0] += 0.5
    ckpt.save({"w": w, "weight_decay": 0.0, "n": 1}, a, "torch")
    ckpt.save({"w": w2, "weight_decay": 0.01, "n": 1.0}, b, "torch")
    d = ckpt.diff(a, b)
    assert not d.equal
    text = str(d)
    assert "value differs: weight_decay: 0.0 vs 0.01" in text, text
    assert "value differs: n: 1 (int) vs 1.0 (float)" in text, text
    assert "first at [1, 0]: 3.0 vs 3.5" in text, text
    assert text.splitlines()[-1].startswith("DIFFERENT: 3 differences"), text
    assert repr(d) == "<DiffReport 3 differences>"
    by_name = {x.name: x for x in d.differences}
    assert (by_name["weight_decay"].kind, by_name["weight_decay"].a, by_name["weight_decay"].b) == ("value", 0.0, 0.01)
    assert by_name["n"].a == 1 and isinstance(by_name["n"].b, float)
    t = by_name["w"]
    assert (t.kind, t.a, t.b, t.max_abs, t.first_index) == ("tensor", 3.0, 3.5, 0.5, [1, 0])
    same = ckpt.diff(a, a)
    assert same.equal and repr(same) == "<DiffReport equal>" and str(same).startswith("equal: 1 tensors")

"""``ckpt.dcp.Writer(path, to="hf")`` inside sharded training jobs (``hf_job.py``: gloo ranks on 127.0.0.1,
FSDP2 model and AdamW state, ``ShardedTensor``, replicated DTensors, plain tensors and object items): the
Hugging Face shards each rank writes are, file for file, what ``ckpt.convert(..., to="hf")`` writes from
torch's own checkpoint of the same job with the same options (headers, records and data; the index byte for
byte); ``safetensors`` and ``transformers`` load them; ``ckpt.dcp.Reader`` loads them back into a job of
another world size; async saves, a failing rank and a URL behave as for DCP checkpoints.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the suite installs torch (scripts/setup.sh): present whenever it runs
from safetensors import safe_open  # noqa: E402

import ckpt  # noqa: E402

JOB = Path(__file__).parent / "hf_job.py"


def job(scenario: str, out: Path, world: int, options: "dict | None" = None) -> None:
    r = subprocess.run([sys.executable, str(JOB), scenario, str(out), str(world), json.dumps(options or {})],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]


def header_and_data(path: Path) -> "tuple[dict, bytes]":
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def assert_same_as_convert(out: Path, options: dict) -> list:
    """``out/hf`` (written by the job's ranks) against ``ckpt.convert(out/torch, ..., to="hf", **options)``:
    the same files, the same headers (``__metadata__`` is a map: compared as one) and data, the same index."""
    conv = out / "converted"
    shutil.rmtree(conv, ignore_errors=True)
    ckpt.convert(out / "torch", conv, to="hf", **options)
    ours, theirs = sorted(p.name for p in (out / "hf").iterdir()), sorted(p.name for p in conv.iterdir())
    assert ours == theirs
    for name in ours:
        if name.endswith(".safetensors"):
            assert header_and_data(out / "hf" / name) == header_and_data(conv / name), name
        else:
            assert (out / "hf" / name).read_bytes() == (conv / name).read_bytes(), name
    return ours


def test_shards_from_a_sharded_job_are_what_convert_writes_and_load_into_another_world_size(tmp_path: Path) -> None:
    options = {"max_shard_size": 600}
    job("save", tmp_path, 2, options)
    files = assert_same_as_convert(tmp_path, options)
    assert "model.safetensors.index.json" in files and len(files) > 3
    # Every tensor, read by the safetensors package, equals torch's own checkpoint read by ckpt.
    theirs = ckpt.load(tmp_path / "torch", framework="pt")
    flat = {}

    def walk(v: object, prefix: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor):
            flat[prefix[:-1]] = v

    walk(theirs, "")
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(flat)
    for name, file in index.items():
        with safe_open(tmp_path / "hf" / file, "pt") as f:
            got, want = f.get_tensor(name), flat[name]
            assert got.dtype == want.dtype and torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), name
    assert ckpt.verify(tmp_path / "hf", deep=True).ok
    # ckpt.dcp.Reader loads the shards into 3 ranks (each rank its own boxes), equal to torch's checkpoint.
    job("load", tmp_path, 3)


def test_selection_dtype_and_shard_size_as_convert_takes_them(tmp_path: Path) -> None:
    options = {"max_shard_size": "1KB", "dtype": "bf16", "include": ["model.*", "optim.state.*", "extra.*"],
               "exclude": "extra.blob", "strip_prefix": "model."}
    job("save", tmp_path, 3, options)
    files = assert_same_as_convert(tmp_path, options)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "0.weight" in index and not any(k.startswith(("model.", "extra.blob")) for k in index), sorted(index)
    with safe_open(tmp_path / "hf" / index["0.weight"], "pt") as f:
        assert f.get_tensor("0.weight").dtype == torch.bfloat16
    assert len(files) == 4


@pytest.mark.parametrize("kind", ["async_thread", "async_process"])
def test_async_saves_write_the_same_shards(tmp_path: Path, kind: str) -> None:
    options = {"max_shard_size": 600}
    job(kind, tmp_path, 2, options)
    assert_same_as_convert(tmp_path, options)


def test_transformers_loads_a_llama_saved_by_two_fsdp2_ranks(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")  # pinned in conformance/requirements.txt
    job("llama", tmp_path, 2, {"max_shard_size": "20KB"})
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama")
    reference = torch.load(tmp_path / "llama.pt")
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(reference)
    for name, t in reference.items():
        assert torch.equal(loaded[name], t), name
    assert len(list((tmp_path / "llama").glob("model-*.safetensors"))) > 1
    assert (tmp_path / "llama" / "config.json").exists()  # carried into the new checkpoint


def test_a_rank_failing_mid_save_fails_it_everywhere_and_keeps_the_previous_shards(tmp_path: Path) -> None:
    job("fail", tmp_path, 2, {"max_shard_size": 600})
    assert not list(tmp_path.glob(".hf.ckpt-staging*"))


def test_overwrite_replaces_a_directory_of_other_files_from_two_ranks(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    for name in ("notes.txt", "PART_000.pt"):
        (tmp_path / "hf" / name).write_text("not ours")
    job("save", tmp_path, 2, {"max_shard_size": "1KB", "overwrite": True})
    files = assert_same_as_convert(tmp_path, {"max_shard_size": "1KB"})  # nothing of the old directory left
    assert "model.safetensors.index.json" in files and "notes.txt" not in files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted", "hf", "torch"], "no staging path left"


def test_options_that_do_not_apply_are_refused() -> None:
    import ckpt.dcp

    with pytest.raises(ckpt.UsageError, match="applies to Hugging Face shards"):
        ckpt.dcp.Writer("x", max_shard_size="5GB")
    with pytest.raises(ckpt.UsageError, match="dcp_profile"):
        ckpt.dcp.Writer("x", to="hf", dcp_profile="torch213")
    with pytest.raises(ckpt.UsageError, match="\"hf\""):
        ckpt.dcp.Writer("x", to="safetensors")
    with pytest.raises(ckpt.UsageError, match="shard size"):
        ckpt.dcp.Writer("x", to="hf", max_shard_size="lots")


def test_a_selection_that_selects_nothing_is_refused(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    import ckpt.dcp

    sd = {"model": {"w": torch.ones(3)}, "step": 3}
    # torch wraps the coordinator's error in its CheckpointException (a BaseException): rank 0's UsageError.
    with pytest.raises(BaseException) as raised:
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(tmp_path / "hf", to="hf", include="nomatch*"), no_dist=True)
    error = raised.value.failures[0][0] if hasattr(raised.value, "failures") else raised.value
    assert isinstance(error, ckpt.UsageError) and "select none of the 2 entries (model.w, step)" in str(error)
    assert not (tmp_path / "hf").exists()
    # One process without a process group: a single model.safetensors, no index.
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(tmp_path / "hf", to="hf"), no_dist=True)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]
    loaded = ckpt.load(tmp_path / "hf", framework="pt")
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.ones(3))

"""Object storage through the Python API: every call that takes a path takes an ``s3://`` URL too, with the
``ckpt`` command's semantics (a source fetched, a target written locally then published) and its
``--storage-option`` keys as ``storage_options``. The server is moto's, in this process, on a free port of
127.0.0.1 (moto[server] is a test dependency: a missing moto fails here, never skips). Configured through the
``AWS_*`` variables or through ``storage_options``, both tested."""

from __future__ import annotations

import gc
import io
import os
from pathlib import Path
from typing import Any, Dict, Iterator

import boto3
import pytest
import torch
import torch.distributed.checkpoint as dcp
from moto import settings as moto_settings
from moto.server import ThreadedMotoServer

import ckpt
import ckpt.dcp
from conftest import same

ACCESS_KEY = "ckpt-test-key"
SECRET_KEY = "ckpt-test-secret-do-not-print"
BUCKET = "ckpt-py"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3 server (all of moto's services) on a free port of 127.0.0.1, with the bucket ``BUCKET``."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        _client(url).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()


def _client(endpoint: str, service: str = "s3", secret: str = SECRET_KEY, key: str = ACCESS_KEY) -> Any:
    return boto3.client(service, endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1")


def _no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


@pytest.fixture
def s3env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``AWS_*`` variables of the server (what a user's environment gives); its endpoint."""
    _no_aws_env(monkeypatch)
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                        "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                        "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(name, value)
    return endpoint


def _options(endpoint: str, secret: str = SECRET_KEY) -> Dict[str, Any]:
    return {"aws_endpoint": endpoint, "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": secret,
            "aws_region": "us-east-1", "aws_allow_http": True, "max_retries": "1"}


def _state() -> Dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {
        "model": {"fc.weight": torch.randn(8, 4, generator=g), "fc.bias": torch.randn(8, generator=g),
                  "emb": torch.randn(16, 6, generator=g).to(torch.bfloat16),
                  "count": torch.arange(5, dtype=torch.int64)},
        "step": 42,
        "lr": 0.125,
    }


def _keys(endpoint: str, prefix: str) -> list:
    listed = _client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_save_and_load_a_pt_file(s3env: str) -> None:
    sd = _state()
    url = f"s3://{BUCKET}/pt/x.pt"
    summary = ckpt.save(sd, url)
    assert summary.tensors == 4
    assert _keys(s3env, "pt/") == ["pt/x.pt"]  # the lock object is gone
    body = _client(s3env).get_object(Bucket=BUCKET, Key="pt/x.pt")["Body"].read()
    same(torch.load(io.BytesIO(body), weights_only=True), sd)  # torch reads what was uploaded
    same(ckpt.load(url, framework="pt"), sd)
    assert ckpt.detect(url) == "torch"
    np_sd = ckpt.load(url, include="model.fc.*")
    assert list(np_sd["model"]) == ["fc.weight", "fc.bias"]
    assert np_sd["model"]["fc.weight"].tobytes() == sd["model"]["fc.weight"].numpy().tobytes()


def test_open_keeps_its_fetched_copy_while_it_lives(s3env: str) -> None:
    sd = _state()
    url = f"s3://{BUCKET}/open/x.pt"
    ckpt.save(sd, url)
    ck = ckpt.open(url, framework="pt")
    local = Path(ck._n().local_path)
    assert ck.path == url and ck.format == "torch" and local.exists()
    assert url in repr(ck)
    same(ck["model.fc.weight"], sd["model"]["fc.weight"])
    same(ck.load(), sd)
    with ckpt.safe_open(url, framework="pt") as f:
        same(f.get_tensor("model.emb"), sd["model"]["emb"])
    ck.close()
    del ck
    gc.collect()
    assert not local.exists()  # the temporary directory went with the checkpoint


def test_dcp_save_convert_verify_reshard_diff(s3env: str, tmp: Path) -> None:
    sd = _state()
    dcp_url = f"s3://{BUCKET}/dcp"
    ckpt.save(sd, dcp_url, format="distcp", world_size=2)
    assert "dcp/.metadata" in _keys(s3env, "dcp/")
    assert ckpt.detect(dcp_url) == "distcp"
    same(ckpt.load(dcp_url, framework="pt"), sd)

    # URL -> URL, both ways through formats
    ckpt.save(sd, f"s3://{BUCKET}/conv/src.pt")
    s = ckpt.convert(f"s3://{BUCKET}/conv/src.pt", f"s3://{BUCKET}/conv/dcp", to="distcp", world_size=3)
    assert s.tensors == 4
    same(ckpt.load(f"s3://{BUCKET}/conv/dcp", framework="pt"), sd)
    ckpt.convert(f"s3://{BUCKET}/conv/dcp", tmp / "back.pt", to="torch")
    same(torch.load(tmp / "back.pt", weights_only=True), sd)

    report = ckpt.verify(dcp_url, deep=True)
    assert report.ok and report.format == "distcp", report.problems

    r = ckpt.reshard(dcp_url, f"s3://{BUCKET}/dcp4", 4)
    assert (r.format, r.world_size, r.tensors) == ("distcp", 4, 4)
    same(ckpt.load(f"s3://{BUCKET}/dcp4", framework="pt"), sd)

    torch.save(sd, tmp / "local.pt")
    assert ckpt.diff(f"s3://{BUCKET}/dcp4", tmp / "local.pt").equal
    changed = _state()
    changed["model"]["fc.bias"] += 1
    torch.save(changed, tmp / "changed.pt")
    d = ckpt.diff(tmp / "changed.pt", dcp_url)
    assert not d.equal and [t.name for t in d.tensors if not t.equal] == ["model.fc.bias"]

    # dcp.load through ckpt.dcp.Reader, and dcp.save through ckpt.dcp.Writer, at URLs
    into = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": 0, "lr": 0.0}
    dcp.load(into, storage_reader=ckpt.dcp.Reader(dcp_url), no_dist=True)
    same(into["model"], sd["model"])
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(f"s3://{BUCKET}/dcpw"), no_dist=True)
    same(ckpt.load(f"s3://{BUCKET}/dcpw", framework="pt")["model"], sd["model"])


def test_a_sharded_job_saves_to_a_url(s3env: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dcp.save`` through ``ckpt.dcp.Writer`` from 3 gloo ranks to an ``s3://`` URL (each rank uploads its own
    file; the coordinator commits): torch's ``FsspecReader`` (s3fs) loads what torch's own writer wrote to a
    directory from the same job; a second save to the same URL replaces it whole."""
    import importlib.util
    import subprocess
    import sys

    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    job = Path(__file__).parent / "training_job.py"
    spec = importlib.util.spec_from_file_location("training_job", job)
    assert spec is not None and spec.loader is not None
    tj = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tj)
    url = f"s3://{BUCKET}/train/step-1"
    monkeypatch.setenv("CKPT_TRAINING_URL", url)

    def load(reader: Any) -> dict:
        sd: dict = {}
        _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
        return sd

    for attempt in range(2):
        r = subprocess.run([sys.executable, str(job), "save", str(tmp / str(attempt)), "3"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
        fs_options = {"key": ACCESS_KEY, "secret": SECRET_KEY, "client_kwargs": {"endpoint_url": s3env}}
        ours = load(FsspecReader(url, **fs_options))
        tj.compare(ours, load(dcp.FileSystemReader(tmp / str(attempt) / "torch")), f"attempt {attempt}")
        keys = _keys(s3env, "train/step-1/")
        assert "train/step-1/.metadata" in keys and len([k for k in keys if k.endswith(".distcp")]) == 3, keys
        assert not [k for k in keys if "lock" in k or "staging" in k], keys

    # ckpt.dcp.Reader reads a URL lazily: a load of one tensor fetches .metadata and that tensor's items, not
    # the data files.
    listed = _client(s3env).list_objects_v2(Bucket=BUCKET, Prefix="train/step-1/")["Contents"]
    data_bytes = sum(o["Size"] for o in listed if o["Key"].endswith(".distcp"))
    reader = ckpt.dcp.Reader(url)
    part = {"extra": {"plain": torch.zeros(7, dtype=torch.int64)}}
    dcp.load(part, storage_reader=reader, no_dist=True)
    assert torch.equal(part["extra"]["plain"], torch.arange(7) * 3)
    objects, fetched, requests = reader._checkpoint().fetched
    metadata_bytes = next(o["Size"] for o in listed if o["Key"].endswith("/.metadata"))
    assert fetched - metadata_bytes < data_bytes / 4, (fetched, metadata_bytes, data_bytes)


def test_a_sharded_job_saves_hugging_face_shards_to_a_url(s3env: str, tmp: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``ckpt.dcp.Writer(url, to="hf")`` from 2 gloo ranks to an ``s3://`` URL: each rank uploads the shards
    it owns, the coordinator writes the index last; the objects are, file for file, what ``ckpt.convert``
    writes from torch's own checkpoint of the same job, and the ``safetensors`` package reads them."""
    import json
    import struct
    import subprocess
    import sys

    from safetensors.torch import load as load_safetensors

    job = Path(__file__).parent / "hf_job.py"
    url = f"s3://{BUCKET}/train-hf/step-1"
    monkeypatch.setenv("CKPT_TRAINING_URL", url)
    options = {"max_shard_size": 600}
    r = subprocess.run([sys.executable, str(job), "save", str(tmp), "2", json.dumps(options)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    ckpt.convert(tmp / "torch", tmp / "converted", to="hf", **options)
    client = _client(s3env)
    keys = sorted(k[len("train-hf/step-1/"):] for k in _keys(s3env, "train-hf/step-1/"))
    assert keys == sorted(p.name for p in (tmp / "converted").iterdir()), keys

    def split(data: bytes) -> tuple:
        (n,) = struct.unpack("<Q", data[:8])
        return json.loads(data[8:8 + n]), data[8 + n:]

    for key in keys:
        ours = client.get_object(Bucket=BUCKET, Key=f"train-hf/step-1/{key}")["Body"].read()
        theirs = (tmp / "converted" / key).read_bytes()
        if key.endswith(".safetensors"):
            assert split(ours) == split(theirs), key
            assert load_safetensors(ours).keys() == load_safetensors(theirs).keys()
        else:
            assert ours == theirs, key


def test_verify_reports_an_unfinished_save(s3env: str) -> None:
    url = f"s3://{BUCKET}/unfinished"
    ckpt.save(_state(), url, format="distcp")
    _client(s3env).put_object(Bucket=BUCKET, Key="unfinished/.ckpt-lock.json", Body=b"{}")
    report = ckpt.verify(url)
    # As `ckpt verify` reports it: a warning (the next save removes it), named by its URL.
    assert any(w.startswith(f"{url}/.ckpt-lock.json: the lock") for w in report.warnings), report.warnings
    assert report.ok


def test_storage_options_instead_of_the_environment(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_env(monkeypatch)
    sd = _state()
    options = _options(endpoint)
    url = f"s3://{BUCKET}/opts/x.safetensors"
    ckpt.save({"a": sd["model"]["fc.weight"]}, url, format="safetensors", storage_options=options)
    assert ckpt.detect(url, storage_options=options) == "safetensors"
    with ckpt.open(url, storage_options=options) as ck:
        assert ck.keys() == ["a"]
        assert ck["a"].tobytes() == sd["model"]["fc.weight"].numpy().tobytes()
    ckpt.convert(url, f"s3://{BUCKET}/opts/hf", to="hf", storage_options=options)
    assert ckpt.diff(url, f"s3://{BUCKET}/opts/hf", storage_options=options).equal
    assert ckpt.verify(f"s3://{BUCKET}/opts/hf", storage_options=options).ok
    # Without them (and without the environment), the store cannot be reached: no endpoint, no credentials.
    with pytest.raises(ckpt.Error):
        ckpt.load(url, storage_options={"aws_endpoint": endpoint, "aws_region": "us-east-1",
                                        "aws_allow_http": "true", "max_retries": "0"})


def test_bad_storage_options_are_usage_errors(s3env: str) -> None:
    url = f"s3://{BUCKET}/pt/x.pt"
    with pytest.raises(ckpt.UsageError) as e:
        ckpt.load(url, storage_options={"no_such_key": "hush-hush"})
    assert "no_such_key" in str(e.value) and "hush-hush" not in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ckpt.UsageError, match="max_retries"):
        ckpt.save(_state(), url, storage_options={"max_retries": "many"})
    with pytest.raises(TypeError):
        ckpt.open(url, storage_options={"aws_region": ["us-east-1"]})
    with pytest.raises(ckpt.UsageError):  # a scheme no store is registered for
        ckpt.open("nosuch://bucket/x.pt")


def test_missing_bucket_and_object_raise_not_found(s3env: str) -> None:
    with pytest.raises(ckpt.NotFoundError) as e:
        ckpt.load("s3://no-such-bucket-ckpt/x.pt")
    assert isinstance(e.value, FileNotFoundError) and e.value.fault == "io"
    assert e.value.path == "s3://no-such-bucket-ckpt/x.pt"
    with pytest.raises(ckpt.NotFoundError):
        ckpt.save(_state(), "s3://no-such-bucket-ckpt/dcp", format="distcp")
    with pytest.raises(ckpt.NotFoundError) as e:
        ckpt.open(f"s3://{BUCKET}/nothing/here.pt")
    assert "nothing/here.pt" in str(e.value)


@pytest.fixture
def authenticating(endpoint: str) -> Iterator[None]:
    """moto checking signatures (it accepts any by default), with an IAM user whose key is ``ACCESS_KEY``'s."""
    iam = _client(endpoint, "iam")
    user = "ckpt-test-user"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    before = moto_settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    try:
        yield key["AccessKeyId"]
    finally:
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = before


def test_wrong_secret_raises_without_showing_it(endpoint: str, authenticating: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_env(monkeypatch)
    wrong = "wrong-secret-that-must-never-be-printed"
    options = dict(_options(endpoint, secret=wrong), aws_access_key_id=authenticating)
    for call in (lambda: ckpt.load(f"s3://{BUCKET}/pt/x.pt", storage_options=options),
                 lambda: ckpt.save(_state(), f"s3://{BUCKET}/denied.pt", storage_options=options)):
        with pytest.raises(ckpt.IoError) as e:
            call()
        text = f"{e.value} {e.value!r} {e.value.path}"
        assert wrong not in text and "credentials" in str(e.value), text
    # Through the environment too.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", authenticating)
    with pytest.raises(ckpt.IoError) as e:
        ckpt.verify(f"s3://{BUCKET}/dcp", storage_options={"aws_endpoint": endpoint, "aws_allow_http": "true",
                                                             "aws_region": "us-east-1"})
    assert wrong not in f"{e.value} {e.value!r}"

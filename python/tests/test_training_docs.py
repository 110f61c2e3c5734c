"""The README's "Training with ckpt" commands run as written: every ``torchrun`` line of the section's ``sh``
blocks, in order, on CPU with gloo (``python/examples/train_fsdp2.py``: an FSDP2 save on 2 ranks, resumes
on 3 and then 2 ranks saving with both async checkpointers, a save to ``s3://`` and a resume from it on 3
ranks), with ``runs/`` under a temporary directory and ``s3://bucket`` on moto's S3 server (127.0.0.1, a free
port). After each command torch's own readers (``FileSystemReader``, ``FsspecReader`` for the URL) load the
checkpoint it ended with. ``python/README.md`` shows the same commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import boto3
import pytest
import torch
from safetensors import safe_open
import torch.distributed.checkpoint as dcp
from moto.server import ThreadedMotoServer
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

import ckpt
from conftest import ROOT

BUCKET = "ckpt-train-docs"
KEY, SECRET = "ckpt-docs-key", "ckpt-docs-secret"


def commands(readme: Path) -> list[str]:
    """The ``torchrun`` commands of the "Training with ckpt" section (continuation lines joined)."""
    text = readme.read_text()
    section = text.split("\n## Training with ckpt\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("torchrun "):
                out.append(" ".join(line.split()))
    return out


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()


def whole(reader) -> dict:
    sd: dict = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return sd


def test_the_training_section_runs_as_written(tmp_path: Path, endpoint: str) -> None:
    cmds = commands(ROOT / "README.md")
    assert len(cmds) == 6, cmds
    assert cmds == commands(ROOT / "python" / "README.md"), "python/README.md shows the same commands"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1", OMP_NUM_THREADS="1")
    fs_options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    for cmd in cmds:
        run = re.sub(r"(?<= )runs/", f"{tmp_path}/runs/", cmd)
        run = run.replace("s3://bucket/", f"s3://{BUCKET}/").replace("http://127.0.0.1:9000", endpoint)
        argv = shlex.split(run)
        argv[0] = str(torchrun)
        r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
        ranks = int(argv[argv.index("--nproc-per-node") + 1])
        steps = int(argv[argv.index("--steps") + 1])
        out = argv[argv.index("--out") + 1]
        if "--resume" in argv:
            resumed = argv[argv.index("--resume") + 1].rsplit("/", 1)[-1]
            assert f"resumed from {resumed}" in r.stdout and f"on {ranks} ranks" in r.stdout, r.stdout
        if out.startswith("s3://"):
            saved = whole(FsspecReader(f"{out}/step-{steps}", **fs_options))
        else:
            latest = (Path(out) / "latest").read_text().strip()
            assert latest == f"step-{steps}", (cmd, latest)
            step_dir = Path(out) / latest
            saved = whole(dcp.FileSystemReader(step_dir))
            assert sorted(p.name for p in step_dir.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(ranks)]
            assert ckpt.verify(step_dir, deep=True).ok
            if steps > 6:  # every local run after the first resumes the latest checkpoint
                assert "resumed from step-" in r.stdout and f"on {ranks} ranks" in r.stdout, r.stdout
        assert saved["step"] == steps, (cmd, saved["step"])
        if "--export-hf" in argv:
            # The model as Hugging Face shards, bfloat16, the "model." prefix stripped: equal to the
            # checkpoint saved at the same step, cast as torch casts.
            hf = Path(argv[argv.index("--export-hf") + 1])
            index = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
            assert sorted(index) == sorted(saved["model"]), sorted(index)
            for name, file in index.items():
                with safe_open(hf / file, "pt") as f:
                    assert torch.equal(f.get_tensor(name), saved["model"][name].to(torch.bfloat16)), name
            assert f"exported step {steps}" in r.stdout, r.stdout
        assert saved["model"]["0.weight"].shape == (64, 16), cmd

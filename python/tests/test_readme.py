"""The README's Python section runs as written (from the repository's root, on the bundled checkpoints)."""

from __future__ import annotations

import os
import re

import torch

from conftest import ROOT


def test_readme_python_section(tmp_path, monkeypatch) -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(ROOT)
    # the state dict of the `dcp.load` example: the m3 checkpoint's tensors, as a job would allocate them
    ns: dict = {"state_dict": {"row": torch.zeros(7, 4), "layer": {"w": torch.zeros(6, 2, dtype=torch.float16)}}}
    for block in blocks:
        exec(compile(block.replace("/tmp/", f"{tmp_path}/"), "README.md", "exec"), ns)  # noqa: S102
    assert ns["state_dict"]["row"].abs().sum() > 0
    assert os.path.exists(tmp_path / "m3_hf" / "model.safetensors") or os.path.exists(
        tmp_path / "m3_hf" / "model.safetensors.index.json")

"""The chart's templates ConfigMap, updated the way the kubelet updates a
mounted ConfigMap (a new timestamped folder, then an atomic swap of the
`..data` symlink), reaches a running Ivy without a restart."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from tests.deploy.tools import one, render, values_file
from tests.support.servers import Ivy, free_port, wait_for


class MountedConfigMap:
    """A ConfigMap volume as the kubelet lays it out."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()
        self.version = 0

    def write(self, data: dict[str, str]) -> None:
        self.version += 1
        folder = self.root / f"..2026_11_30_00_00_0{self.version}.000000000"
        folder.mkdir()
        for name, text in data.items():
            (folder / name).write_text(text)
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(folder.name)
        os.replace(tmp, self.root / "..data")


def reloads(ivy: Ivy, result: str) -> float:
    status, body = ivy.get("/metrics")
    assert status == 200
    m = re.search(rf'^ivy_config_reloads_total\{{[^}}]*result="{result}"[^}}]*\}} (\S+)$', body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def test_configmap_update_reloads_ivy_in_place(helm_bin, tulip_minilm, minilm_dir, log_dir, tmp_path):
    def configmap(prompts: dict) -> dict[str, str]:
        values = {"ivy": {"config": {"defaultPromptName": "query", "prompts": prompts}}}
        return one(render(values_file(tmp_path, values)), "ConfigMap", "ivy")["data"]

    mount = MountedConfigMap(tmp_path / "etc-ivy")
    mount.write(configmap({"query": "query: ", "document": "passage: "}))
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir,
              env={"IVY_CONFIG": str(mount.root / "templates.toml"), "IVY_GRPC_PORT": str(free_port())})
    try:
        pid = ivy.proc.pid
        before = reloads(ivy, "accepted")
        mount.write(configmap({"query": "Represent this question: ", "document": "passage: "}))
        wait_for(lambda: reloads(ivy, "accepted") > before, "Ivy to reload the swapped ConfigMap")
        # A broken update is refused and Ivy keeps serving the last good one.
        mount.write({"templates.toml": "default_prompt_name = \n"})
        wait_for(lambda: reloads(ivy, "refused") > 0, "Ivy to refuse a broken file")
        status, _ = ivy.post_json("/v1/embeddings", {"input": ["still serving"]})
        assert status == 200
        assert ivy.alive() and ivy.proc.pid == pid
        # SIGHUP forces a reload as well.
        accepted = reloads(ivy, "accepted")
        mount.write(configmap({"query": "query: "}))
        ivy.signal(signal.SIGHUP)
        wait_for(lambda: reloads(ivy, "accepted") > accepted, "Ivy to reload on SIGHUP")
    finally:
        ivy.stop()

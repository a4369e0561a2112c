"""The bundled snapshots: one healthy file and the fault table that builds the rest (faults.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, SNAPSHOTS, faults_module, snapshot_path

from slurmhealth.node.runner import load_snapshot

faults = faults_module()

# sha256 of json.dumps(doc, sort_keys=True) of each fault, taken from the hand-edited files that
# faults.py replaced (each was built equal to its file before they were removed): a patch that
# changes a fault fails here, and the new digest goes in with the reason for the change.
DIGESTS = {
    "ecc-dbe": "2b732be57a246f20fa479fde5739f62ee1c8d5a46f2a0d30d33c0c987eef4b91",
    "ecc-off": "7f1a454da85f1c133fd868f66ed207c5f15df0dee1591e3400740d68381c9631",
    "ecc-pending-off": "4e1a7b5bf810868e70cafd13c62b1105ecb60d8d6359b56cbc3101d5ec5eda8b",
    "fabric-in-progress": "7c4b93d80673b87c4b9ff3347ac8f0a7a536851c1117fdcd80519d4ea60fc012",
    "gpu-lost": "8ca000e8ddf86bb816d5ffc66537ce7c940344f652711bb711900f317ce94f89",
    "gpu-missing": "59c5dbb6ac021214ecfb2468473ad4db59c6261e895565653595c7edd88cfbbd",
    "gpu-model-odd": "0ba3066ca8bd3fccb5451dc08b91bdb277a071f8bc908de6f01368dcbe685505",
    "hca-pcie-downtrained": "264700e2f26c99b1f2a7afb12285a3e52452efdaddb4bdaa2bcc7c8230f71daa",
    "mig-on": "042b0ef05ff9e3b9be8a9fcea34c8eca354d373744596256f2b624f8736ea265",
    "mig-pending": "e6c50e646291b2af1aa873f0d1a79c1208578bcea3ff3973cc391b683afc78f5",
    "nvlink-down": "c6e1a78228673035f56bc9b725989f108ec604c56bc03c5974102c867fdcab3b",
    "pcie-under-load-gen3": "8dd82252539dc85483d542b07dd64a9a5948959789897f92141fb503b5431e26",
    "pcie-x8": "6950d603c38b52fd3d664d0b9c7da7fe95bf3f978d4c9b7664a98c595a8814f6",
    "persistence-off": "9915caf239a0eaf970ce3fa9c945123b5416b557c35021c2d3218bbf5f234e6a",
    "processes-left": "b414e747094718e0b1e0e2af45cc8a7d6b3b8410963ae44b7d60fb7902e67810",
    "recovery-reset": "8370447b2553d90ebb8f28a558ef1d9e4378b7af46f3ab0995de4a8156f42b0b",
    "remap-failure": "8b7dc5837fbdde1072193593727f1ef03a428b07e1d7e63cfdc187821682910f",
    "remap-pending": "b1c6618c795486681c43e90bbdb121c11b15c22e8eb5c920f41c8dddfffd9ff1",
    "remap-spares-gone": "8dcb66b5a858548a05d0e9734d32f1f39f2ae4f3de30260956053677027fd5df",
    "retired-pages-full": "0790009034d676672a1c0916302e453a6743bc1a1e9ca64c6bd662690dafdf4a",
    "sbe-tens-of-millions": "76c6d22ad03fb93940002be127b3d00964bb13851cf71d35bdf42b0380a096a9",
    "thermal": "334aac6555955154800e9b44d29d131463caa4f5f8193a43d2467b458eaa60f9",
    "vbios-drift": "bb67ccdbd6733b0b47a5ce3330e7e9fc6cb10cbb460a5a255cd01eff469a7f2a",
    "xid-79": "823fb5499f07cfe8917d036b6b30931c4cea691a43fd34f0295c1e751bd79410",
}


def digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# Captured on a real node, not built: each replayed by tests/node/test_h200_live.py
LIVE = ("h200-live.json", "h200-live-busy.json", "h200-live-verdicts.json", "h200-live.toml")
# Modelled from NVIDIA's documentation, not captured: another kind of node than the H100 HGX of
# the faults (tests/node/checks/test_gpu_fabric.py builds its faults)
MODELLED = ("gb200-nvl72-healthy.json",)


def test_the_table_is_the_frozen_set_of_faults():
    assert set(faults.FAULTS) == set(DIGESTS)
    assert faults.NAMES == ("healthy", *faults.FAULTS)
    on_disk = sorted(f for f in os.listdir(SNAPSHOTS) if f.endswith((".json", ".toml")))
    expected = sorted(["h100-hgx-healthy.json", *LIVE, *MODELLED])
    assert on_disk == expected, "faults are patches in faults.py, not copies"


def test_every_snapshot_file_is_described_in_the_format_doc():
    with open(os.path.join(REPO, "docs", "snapshot-format.md"), encoding="utf-8") as handle:
        doc = handle.read()
    for name in ("h100-hgx-healthy.json", "faults.py", *LIVE, *MODELLED):
        assert f"tests/fixtures/snapshots/{name}" in doc, name


@pytest.mark.parametrize("name", sorted(faults.FAULTS))
def test_each_fault_builds_differs_from_healthy_and_keeps_its_digest(name):
    why, patches = faults.FAULTS[name]
    assert why and "\n" not in why and patches
    doc = faults.build(name)
    assert doc != faults.build("healthy")
    assert digest(doc) == DIGESTS[name]


def test_build_leaves_the_table_and_the_healthy_snapshot_alone():
    before = json.dumps(faults.FAULTS, sort_keys=True)
    healthy = faults.build("healthy")
    faults.build("processes-left")["gpu"]["devices"][0]["processes"].append("mutated")
    assert faults.build("processes-left")["gpu"]["devices"][0]["processes"] == [
        {"pid": 48211, "used_memory": 1073741824}
    ]
    assert json.dumps(faults.FAULTS, sort_keys=True) == before
    assert faults.build("healthy") == healthy


def test_patches_set_delete_and_append():
    doc = {"a": {"b": [1, {"c": 2}]}, "l": []}
    out = faults.apply(doc, [("set", "a.b.1.c", 3), ("delete", "a.b.0"), ("append", "l", {"x": 1})])
    assert out == {"a": {"b": [{"c": 3}]}, "l": [{"x": 1}]}
    assert doc == {"a": {"b": [1, {"c": 2}]}, "l": []}, "the input is left alone"


@pytest.mark.parametrize(
    "patch",
    [
        ("set", "gpu.devices.3.no_such_key", 1),
        ("set", "gpu.devices.8.error", "GpuIsLost"),
        ("set", "gpu.devices.-1.error", "GpuIsLost"),
        ("delete", "gpu.nope"),
        ("delete", "gpu.devices.x"),
        ("append", "kmsg.no_records", {}),
        ("set", "gpu.count.deeper", 1),
    ],
)
def test_a_path_that_does_not_exist_is_refused(patch):
    with pytest.raises(KeyError):
        faults.apply(faults.build("healthy"), [patch])


@pytest.mark.parametrize(
    "patch", [("append", "gpu.count", 1), ("move", "gpu.count", 1), ("delete", "gpu.count", 1)]
)
def test_a_malformed_patch_is_refused(patch):
    with pytest.raises(ValueError):
        faults.apply(faults.build("healthy"), [patch])


def test_written_files_round_trip_through_the_real_loader(tmp_path):
    paths = faults.write_all(str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        f"h100-hgx-{name}.json" for name in faults.NAMES
    )
    for name, path in zip(faults.NAMES, paths):
        assert load_snapshot(path) == faults.build(name)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths)
    with open(os.path.join(SNAPSHOTS, "h100-hgx-healthy.json"), encoding="utf-8") as handle:
        assert handle.read() == (tmp_path / "h100-hgx-healthy.json").read_text(encoding="utf-8")


def test_the_command_line_writes_them_all_and_conftest_serves_them(tmp_path):
    script = os.path.join(SNAPSHOTS, "faults.py")
    done = subprocess.run(
        [sys.executable, script, str(tmp_path / "out")], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    for name in faults.NAMES:
        written = load_snapshot(str(tmp_path / "out" / f"h100-hgx-{name}.json"))
        assert written == load_snapshot(snapshot_path(name))
    done = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert done.returncode != 0 and "usage" in done.stderr

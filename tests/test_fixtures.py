"""The bundled snapshots: one healthy file and the fault table that builds the rest (faults.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import SNAPSHOTS, faults_module, snapshot_path

from slurmhealth.node.runner import load_snapshot

faults = faults_module()

# sha256 of json.dumps(doc, sort_keys=True) of each fault, taken from the hand-edited files that
# faults.py replaced (each was built equal to its file before they were removed): a patch that
# changes a fault fails here, and the new digest goes in with the reason for the change.
DIGESTS = {
    "ecc-dbe": "2fcd9bb9bffb564e1adfe37fcd216d3c500d228c9ee1ee0654c8c03b78e44a38",
    "ecc-off": "cf0f40c20ff6e7f20f26e77355ed6008f426a4661aae9070a71a035ac9c7580d",
    "fabric-in-progress": "447be4168774cd97e61fd5d7c8a08b8aca7a34a7098bb972d97a41841526936c",
    "gpu-lost": "577824451a945dc7d96244e9e8348f12a1c5aaad5c25ce57695dc4ae27eb2b5c",
    "gpu-missing": "d937efa2e98d517eedb452aa71c1353e6b5843da91335ab3b66119e10ca2a01a",
    "nvlink-down": "bcfeb77f180e703364ee99766b59f2ff4611d0815d3f71bf4c063b0a8cac9e46",
    "pcie-x8": "782612bb2648041e9986ee706e8a57b1aaef5707642a2b3295c9e31919f5915c",
    "persistence-off": "b45e67ad0aa10191251f5e971dcf63805044f1e5a1aecf80b46040555b436244",
    "processes-left": "241bdbbd6f8d1aca4b87e15654d342364f60c0003619724f4ade10ffe9b17465",
    "recovery-reset": "7ae2e26edb87b9bef79eeff25e171bded68e0cdcc02cdbae883f83c2c8b59b81",
    "remap-failure": "0c94a9f11937bf4c26f1581a6d55b28d3458afbc84abaa0a5a7117a4efeda345",
    "remap-pending": "5d4da0d558247a0e9f15d5d5f88164ba816ba78e18c2b83ca4ff6946b0a9b83e",
    "remap-spares-gone": "1cf9f9a5dcc52d0221c3d1ef08181a3060a2b21ebb213fad712966b506cfbe1c",
    "retired-pages-full": "7b2a05a80caa4508a93236a434f82427ac5e0c44096e81805079990ef65db2c5",
    "sbe-tens-of-millions": "551f7e70851dfc9641641ddb9f35ff04b8e2f6c53fd903776a647b60b34310c0",
    "thermal": "c4670021878173b3b2c8c5bda17ee476f30e20cba1486e71b65d4dd819ac7149",
    "vbios-drift": "32ed0cf457a177bc99434197a41daa21e58500fdc44af831061f0e03269280f8",
    "xid-79": "0f41a2796cd1e452dd7e671580ba699cf3fa469ced1c50946d7237f20b7676ea",
}


def digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def test_the_table_is_the_frozen_set_of_faults():
    assert set(faults.FAULTS) == set(DIGESTS)
    assert faults.NAMES == ("healthy", *faults.FAULTS)
    on_disk = [f for f in os.listdir(SNAPSHOTS) if f.endswith(".json")]
    assert on_disk == ["h100-hgx-healthy.json"], "faults are patches in faults.py, not copies"


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

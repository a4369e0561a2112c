"""sources/sysfs.py: raw strings from a (fake) /sys, failures recorded, never raised."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil

import conftest
import pytest

from slurmhealth.node.sources import sysfs

FIXTURES = os.path.join(conftest.FIXTURES, "sysfs")
HEALTHY = os.path.join(FIXTURES, "healthy-8x-ndr")


def copy_fixture(tmp_path, scenario: str = "healthy-8x-ndr") -> str:
    root = str(tmp_path / "sys")
    shutil.copytree(os.path.join(FIXTURES, scenario), root)
    return root


def ib_file(root: str, rel: str) -> str:
    return os.path.join(root, "class", "infiniband", rel)


def fail_open(monkeypatch, suffix: str, code: int) -> None:
    """Make sysfs's open() raise OSError(code) for paths ending in suffix (root reads all)."""

    def fake_open(path, *args, **kwargs):
        if str(path).endswith(suffix):
            raise OSError(code, os.strerror(code), path)
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(sysfs, "open", fake_open, raising=False)


def test_healthy_raw_strings():
    raw = sysfs.read(HEALTHY)
    assert sorted(raw["devices"]) == [f"mlx5_{i}" for i in range(8)]
    assert "errors" not in raw
    dev = raw["devices"]["mlx5_0"]
    assert dev["fw_ver"] == "28.39.1002"
    assert dev["hca_type"] == "MT4129"
    assert dev["board_id"] == "MT_0000000838"
    assert dev["node_guid"] == "b83f:d203:00a1:2b3c"
    assert "node_type" not in dev  # present in the tree, not needed: not read
    port = dev["ports"]["1"]
    assert port["state"] == "4: ACTIVE"
    assert port["phys_state"] == "5: LinkUp"
    assert port["rate"] == "400 Gb/sec (4X NDR)"
    assert port["link_layer"] == "InfiniBand"
    assert port["counters"] == {
        "symbol_error": "0",
        "link_downed": "1",
        "link_error_recovery": "0",
        "port_rcv_errors": "0",
        "local_link_integrity_errors": "0",
        "excessive_buffer_overrun_errors": "0",
    }
    assert raw["devices"]["mlx5_3"]["ports"]["1"]["counters"]["symbol_error"] == "2"


def test_snapshot_round_trip_is_exact():
    raw = sysfs.read(os.path.join(FIXTURES, "counters-na"))
    assert json.loads(json.dumps(raw)) == raw
    assert raw["devices"]["mlx5_1"]["ports"]["1"]["counters"]["link_downed"] == "N/A (no PMA)"


@pytest.mark.parametrize("sub", ["", "class", "class/infiniband-not-here"])
def test_no_infiniband_dir(tmp_path, sub):
    (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    assert sysfs.read(str(tmp_path)) == {"devices": {}}


def test_missing_root():
    assert sysfs.read("/nonexistent/slurmhealth-sys") == {"devices": {}}


def test_empty_infiniband_dir(tmp_path):
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert sysfs.read(str(tmp_path)) == {"devices": {}}


def test_einval_counter_is_none_and_recorded(monkeypatch):
    # Restricted-PF HCAs answer some counter reads with EINVAL (docs/sources.md).
    fail_open(monkeypatch, "mlx5_0/ports/1/counters/link_downed", errno.EINVAL)
    raw = sysfs.read(HEALTHY)
    counters = raw["devices"]["mlx5_0"]["ports"]["1"]["counters"]
    assert counters["link_downed"] is None
    assert counters["symbol_error"] == "0"
    assert raw["errors"] == {"mlx5_0:1/counters/link_downed": "EINVAL"}


@pytest.mark.parametrize("code,name", [(errno.EIO, "EIO"), (errno.EACCES, "EACCES")])
def test_unreadable_device_file(monkeypatch, code, name):
    fail_open(monkeypatch, "mlx5_4/fw_ver", code)
    raw = sysfs.read(HEALTHY)
    assert raw["devices"]["mlx5_4"]["fw_ver"] is None
    assert raw["devices"]["mlx5_4"]["ports"]["1"]["state"] == "4: ACTIVE"
    assert raw["errors"] == {"mlx5_4/fw_ver": name}


def test_non_utf8_is_replaced_and_noted(tmp_path):
    root = copy_fixture(tmp_path)
    with open(ib_file(root, "mlx5_2/ports/1/state"), "wb") as f:
        f.write(b"4: ACT\xffVE\n")
    raw = sysfs.read(root)
    assert raw["devices"]["mlx5_2"]["ports"]["1"]["state"] == "4: ACT\ufffdVE"
    assert raw["errors"] == {"mlx5_2:1/state": "non-UTF-8"}


def test_truncated_and_garbage_files(tmp_path):
    root = copy_fixture(tmp_path)
    with open(ib_file(root, "mlx5_0/ports/1/rate"), "w") as f:
        f.write("")  # empty
    with open(ib_file(root, "mlx5_1/ports/1/state"), "w") as f:
        f.write("4: ACT")  # cut short, no newline
    with open(ib_file(root, "mlx5_2/fw_ver"), "wb") as f:
        f.write(b"\x00" * 100_000)  # binary, longer than a page
    raw = sysfs.read(root)
    assert raw["devices"]["mlx5_0"]["ports"]["1"]["rate"] == ""
    assert raw["devices"]["mlx5_1"]["ports"]["1"]["state"] == "4: ACT"
    assert raw["devices"]["mlx5_2"]["fw_ver"] == "\x00" * 4096  # one page at most
    assert "errors" not in raw


def test_missing_pieces_recorded(tmp_path):
    root = copy_fixture(tmp_path)
    shutil.rmtree(ib_file(root, "mlx5_1/ports/1/counters"))
    shutil.rmtree(ib_file(root, "mlx5_2/ports"))
    os.remove(ib_file(root, "mlx5_3/board_id"))
    raw = sysfs.read(root)
    assert set(raw["devices"]["mlx5_1"]["ports"]["1"]["counters"].values()) == {None}
    assert raw["errors"]["mlx5_1:1/counters/symbol_error"] == "ENOENT"
    assert raw["devices"]["mlx5_2"]["ports"] == {}
    assert raw["errors"]["mlx5_2/ports"] == "ENOENT"
    assert raw["devices"]["mlx5_3"]["board_id"] is None
    assert raw["errors"]["mlx5_3/board_id"] == "ENOENT"
    assert raw["devices"]["mlx5_4"]["ports"]["1"]["state"] == "4: ACTIVE"


def test_stray_file_in_class_dir(tmp_path):
    root = copy_fixture(tmp_path, "rate-200")
    with open(ib_file(root, "README"), "w") as f:
        f.write("not a device\n")
    raw = sysfs.read(root)
    assert raw["devices"]["README"]["ports"] == {}
    assert raw["errors"]["README/ports"] == "ENOTDIR"
    assert raw["devices"]["mlx5_1"]["ports"]["1"]["rate"] == "200 Gb/sec (4X HDR)"


def test_symlinked_devices_like_real_sysfs(tmp_path):
    # /sys/class/infiniband/mlx5_0 is a symlink into /sys/devices/pci.../infiniband/mlx5_0.
    real = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:1a:00.0" / "infiniband"
    real.mkdir(parents=True)
    shutil.copytree(os.path.join(HEALTHY, "class", "infiniband", "mlx5_0"), str(real / "mlx5_0"))
    cls = tmp_path / "sys" / "class" / "infiniband"
    cls.mkdir(parents=True)
    os.symlink(str(real / "mlx5_0"), str(cls / "mlx5_0"))
    raw = sysfs.read(str(tmp_path / "sys"))
    assert raw["devices"]["mlx5_0"]["ports"]["1"]["phys_state"] == "5: LinkUp"


def test_unlistable_class_dir(monkeypatch):
    def fake_listdir(path):
        raise PermissionError(errno.EACCES, "denied", path)

    monkeypatch.setattr(sysfs.os, "listdir", fake_listdir)
    assert sysfs.read(HEALTHY) == {"devices": {}, "errors": {"class/infiniband": "EACCES"}}


# ---------------------------------------------------------------- the HCA's PCIe link

PCIE = os.path.join(FIXTURES, "pcie-gen5-x16")


def test_pcie_link_read_from_the_pci_device():
    # <dev>/device is the HCA's PCI device (a link there on a real node); its link files as the
    # kernel's Documentation/ABI/testing/sysfs-bus-pci documents them, "32.0 GT/s PCIe", "16".
    raw = sysfs.read(PCIE)
    assert "errors" not in raw
    dev = raw["devices"]["mlx5_0"]
    assert {k: dev[k] for k in sysfs.LINK_FILES} == {
        "current_link_speed": "32.0 GT/s PCIe",
        "current_link_width": "16",
        "max_link_speed": "32.0 GT/s PCIe",
        "max_link_width": "16",
    }
    down = sysfs.read(os.path.join(FIXTURES, "pcie-hca-downtrained"))["devices"]
    assert down["mlx5_3"]["current_link_width"] == "8"
    assert down["mlx5_6"]["current_link_speed"] == "16.0 GT/s PCIe"


def test_no_pci_device_means_no_link_keys_and_no_errors():
    raw = sysfs.read(HEALTHY)  # the older tree: no device/ directory
    assert not set(sysfs.LINK_FILES) & set(raw["devices"]["mlx5_0"])
    assert "errors" not in raw


def test_unreadable_link_file_is_none_and_recorded(monkeypatch, tmp_path):
    root = copy_fixture(tmp_path, "pcie-gen5-x16")
    os.remove(ib_file(root, "mlx5_2/device/max_link_width"))
    fail_open(monkeypatch, "mlx5_0/device/current_link_width", errno.EINVAL)
    raw = sysfs.read(root)
    assert raw["devices"]["mlx5_0"]["current_link_width"] is None
    assert raw["devices"]["mlx5_0"]["current_link_speed"] == "32.0 GT/s PCIe"
    assert raw["devices"]["mlx5_2"]["max_link_width"] is None
    assert raw["errors"] == {
        "mlx5_0/device/current_link_width": "EINVAL",
        "mlx5_2/device/max_link_width": "ENOENT",
    }


def test_the_healthy_snapshot_ib_section_is_this_tree():
    """The healthy snapshot's `ib` section is what the source reads from pcie-gen5-x16
    (healthy-8x-ndr plus each HCA's PCIe link)."""
    with open(conftest.snapshot_path("healthy")) as handle:
        assert json.load(handle)["ib"] == sysfs.read(PCIE)

"""The odd node out (fleet/drift.py, pure): a node against the majority of its hardware class;
a rollout is not an odd node; classes are never compared with each other."""

from __future__ import annotations

from slurmhealth.fleet import drift

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def recorded(model: str, driver: str = "550.90.07", **more) -> dict:
    base = {"model": model, "driver": driver, "ecc": "1", "persistence": "1", "ib_rate": "400"}
    return dict(base, **more)


def fleet(size: int = 64, model: str = H100, prefix: str = "a") -> dict:
    return {f"{prefix}{i:03d}": recorded(model) for i in range(size)}


def test_one_old_driver_is_named_with_the_majority():
    found = fleet()
    found["a007"] = recorded(H100, driver="535.161.08")
    out = drift.odd_nodes(found)
    assert out["odd"] == [f"a007: driver 535.161.08 vs 550.90.07 on 63 of 63 peers ({H100})"]
    (item,) = [i for i in out["items"] if i["what"] == "driver"]
    assert item["differ_count"] == 1 and item["rolling"] == []


def test_settings_are_compared_too():
    found = fleet()
    found["a003"] = recorded(H100, ecc="0")
    found["a004"] = recorded(H100, ib_rate="200")
    found["a005"] = recorded(H100, persistence="0, 1")  # disagrees with itself
    lines = drift.odd_nodes(found)["odd"]
    assert [line.split(":")[0] for line in lines] == ["a005", "a003", "a004"]
    assert "ECC mode 0 vs 1" in lines[1] and "IB rate 200 vs 400" in lines[2]


def test_a_rolling_update_is_not_an_odd_node():
    found = fleet()
    for i in range(20):  # 31% already on the new driver
        found[f"a{i:03d}"] = recorded(H100, driver="560.35.03")
    out = drift.odd_nodes(found)
    assert out["odd"] == []
    (item,) = [i for i in out["items"] if i["what"] == "driver"]
    assert item["rolling"] == [{"value": "560.35.03", "nodes": 20, "stage": "new"}]


def test_classes_are_compared_within_themselves():
    found = {**fleet(40), **fleet(10, H200, "b")}
    for node in list(found)[40:]:
        found[node] = recorded(H200, driver="560.35.03")  # another generation, another driver
    assert drift.odd_nodes(found)["odd"] == []
    found["b003"] = recorded(H200, driver="550.90.07")
    assert drift.odd_nodes(found)["odd"][0].startswith("b003: driver 550.90.07 vs 560.35.03")


def test_nodes_without_versions_are_counted_apart():
    found = fleet(4)
    found["a009"] = None
    out = drift.odd_nodes(found)
    assert out["unknown"] == 1 and out["unknown_nodes"] == ["a009"]


def test_versions_reads_untrusted_sources_json():
    sources = {
        "gpu": {
            "versions": {
                "driver": "550\\n<x>",
                "vbios": ["96.00.99.00.01"],
                "model": [H100],
                "ecc": [1],
                "mig": [0],
                "persistence": [1],
            }
        },
        "ib": {"versions": {"fw_ver": {"mlx5_0": "28.39.1002"}, "rate": [400.0]}},
    }
    got = drift.versions(sources)
    assert got == {
        "driver": "550\\n<x>",
        "model": H100,
        "vbios": "96.00.99.00.01",
        "persistence": "1",
        "ecc": "1",
        "mig": "0",
        "ib_rate": "400",
        "ib_fw": "28.39.1002",
    }
    assert drift.versions("not a dict") == {} and drift.versions({"gpu": {"versions": 5}}) == {}


def test_an_old_kernel_or_cuda_driver_is_an_odd_node():
    """Issue 13: kernel and CUDA versions are compared like the driver."""
    found = {n: dict(v, kernel="6.1.0-28-amd64", cuda="12.4") for n, v in fleet().items()}
    found["a011"] = dict(found["a011"], kernel="6.1.0-18-amd64")
    found["a012"] = dict(found["a012"], cuda="12.2")
    lines = drift.odd_nodes(found)["odd"]
    assert f"a011: kernel 6.1.0-18-amd64 vs 6.1.0-28-amd64 on 63 of 63 peers ({H100})" in lines
    assert f"a012: CUDA (driver) 12.2 vs 12.4 on 63 of 63 peers ({H100})" in lines
    sources = {
        "gpu": {"versions": {"driver": "550.90.07", "cuda": "12.4", "model": [H100]}},
        "kmsg": {"versions": {"kernel": "6.1.0-28-amd64\x1b[31m"}},
    }
    got = drift.versions(sources)
    assert got["cuda"] == "12.4" and got["kernel"].startswith("6.1.0-28-amd64")
    assert "\x1b" not in got["kernel"]


def test_lowered_application_clocks_are_an_odd_setting():
    """Application clocks (nvmlDeviceGetApplicationsClock, "SM/memory MHz" per node from the
    GPU area's versions_of) are a setting like ECC: one node set lower is named."""
    sources = {"gpu": {"versions": {"model": [H200], "app_clocks": ["1980/3201 MHz"]}}}
    assert drift.versions(sources)["app_clocks"] == "1980/3201 MHz"
    found = {f"a{i:03d}": recorded(H200, app_clocks="1980/3201 MHz") for i in range(32)}
    found["a011"] = recorded(H200, app_clocks="1755/3201 MHz, 1980/3201 MHz")
    (line,) = drift.odd_nodes(found)["odd"]
    assert line == (
        f"a011: application clocks 1755/3201 MHz, 1980/3201 MHz vs 1980/3201 MHz on 31 of 31 "
        f"peers ({H200})"
    )


def test_in_a_small_class_one_node_is_odd_not_a_rollout():
    """In a class of five one node is 20%, the rollout share: it is named all the same (one
    node alone is never a rollout); two of five are a rollout."""
    found = {f"h{i}": recorded(H200) for i in range(5)}
    found["h2"] = recorded(H200, driver="535.161.08")
    assert drift.odd_nodes(found)["odd"] == [
        f"h2: driver 535.161.08 vs 550.90.07 on 4 of 4 peers ({H200})"
    ]
    found["h3"] = recorded(H200, driver="535.161.08")
    out = drift.odd_nodes(found)
    assert out["odd"] == []
    (item,) = [i for i in out["items"] if i["what"] == "driver"]
    assert item["rolling"] == [{"value": "535.161.08", "nodes": 2, "stage": "new"}]


def test_a_rollouts_first_nodes_on_a_newer_version_are_not_odd():
    """Issue 13: a rollout starts on a few nodes (5% here, under the 20% share): a version newer
    than the majority's on two or more nodes is the rollout, shown as such; an older one on as
    many nodes stays odd, and one node alone on a newer one is odd."""
    found = fleet(300)
    for i in range(15):
        found[f"a{i:03d}"] = recorded(H100, driver="560.35.03")
    found["a200"] = recorded(H100, driver="535.161.08")
    found["a201"] = recorded(H100, driver="535.161.08")
    out = drift.odd_nodes(found)
    (item,) = [i for i in out["items"] if i["what"] == "driver"]
    assert item["rolling"] == [{"value": "560.35.03", "nodes": 15, "stage": "new"}]
    assert [d["node"] for d in item["differ"]] == ["a200", "a201"]
    alone = fleet(300)
    alone["a000"] = recorded(H100, driver="560.35.03")
    assert drift.odd_nodes(alone)["odd"][0].startswith("a000: driver 560.35.03 vs 550.90.07")


def test_versions_are_ordered_part_by_part_hex_included():
    assert drift._newer("5.15.0-122-generic", "5.15.0-113-generic")
    assert not drift._newer("5.15.0-105-generic", "5.15.0-113-generic")
    assert drift._newer("96.00.99.00.01", "96.00.74.00.0D")  # VBIOS parts are hexadecimal
    assert drift._newer("96.00.A5.00.01", "96.00.99.00.03")
    assert drift._newer("560.35.03", "550.90.07") and not drift._newer("550.90.07", "550.90.07")
    # a node's set with one old VBIOS among new ones is not newer: it is odd
    assert not drift._newer("96.00.74.00.0D, 96.00.99.00.01", "96.00.99.00.01")


def test_nodes_not_yet_updated_are_a_rollouts_old_end():
    """At 90% of a rollout the nodes still on the old driver are the minority: they are the
    rollout's old end while the majority's nodes moved to the new driver from it within the
    look-back, and odd once the majority had it all along (a week later)."""
    found, before = fleet(100), fleet(100)
    for i in range(90):
        found[f"a{i:03d}"] = recorded(H100, driver="560.35.03")
    found["a095"] = recorded(H100, driver="535.161.08")  # an old driver planted meanwhile
    out = drift.odd_nodes(found, before=before)
    (item,) = [i for i in out["items"] if i["what"] == "driver"]
    assert item["majority"] == "560.35.03"
    assert item["rolling"] == [{"value": "550.90.07", "nodes": 9, "stage": "old"}]
    assert out["odd"] == [
        f"a095: driver 535.161.08 vs 560.35.03 on 90 of 99 peers ({H100})",
    ]
    settled = dict(found)  # a week on: every node in the look-back already ran 560.35.03
    out = drift.odd_nodes(settled, before=settled)
    assert len(out["odd"]) == 10 and out["odd"][0].startswith("a090: driver 550.90.07")
    assert drift.odd_nodes(found)["odd"][0].startswith("a090: driver 550.90.07")  # no history


def test_the_hosts_nccl_is_compared_like_the_kernel():
    """Issue 13: the host's NCCL (the kmsg source's `nccl`) is a version of the class: one node
    on an older one is odd, two on a newer one are a rollout's start."""
    sources = {"kmsg": {"versions": {"kernel": "6.1.0-28-amd64", "nccl": "2.21.5"}}}
    assert drift.versions(sources)["nccl"] == "2.21.5"
    found = {n: dict(v, nccl="2.21.5") for n, v in fleet().items()}
    found["a004"] = dict(found["a004"], nccl="2.18.3")
    found["a005"] = dict(found["a005"], nccl="2.23.4")
    found["a006"] = dict(found["a006"], nccl="2.23.4")
    out = drift.odd_nodes(found)
    assert out["odd"] == [f"a004: NCCL (host) 2.18.3 vs 2.21.5 on 61 of 63 peers ({H100})"]
    (item,) = [i for i in out["items"] if i["what"] == "NCCL (host)"]
    assert item["rolling"] == [{"value": "2.23.4", "nodes": 2, "stage": "new"}]


def test_a_run_whose_gpu_source_answered_needs_no_older_run():
    assert drift.gpu_answered({"gpu": {"status": "ok", "versions": {"driver": "550.90.07"}}})
    assert not drift.gpu_answered({"gpu": {"status": "timeout"}, "ib": {"status": "ok"}})
    assert not drift.gpu_answered({"ib": {"status": "ok"}})
    assert not drift.gpu_answered(["not", "a", "dict"])


def test_firmware_is_recorded_per_hca_product():
    """checks/ib.py versions_of records each HCA's product beside its firmware: the firmware
    of each product is one item, and an HCA recorded without a product (an older run) keeps
    the plain one."""
    ib = {
        "fw_ver": {"mlx5_0": "28.39.1002", "mlx5_1": "28.39.1002", "cxgb4_0": "1.27.5.0"},
        "product": {"mlx5_0": "MT4129", "mlx5_1": "MT4129", "cxgb4_0": "cxgb4\x1b[31m"},
    }
    got = drift.versions({"ib": {"versions": ib}})
    assert got["ib_fw:MT4129"] == "28.39.1002"
    (hostile_key,) = [k for k in got if k.startswith("ib_fw:cxgb4")]
    assert "\x1b" not in hostile_key
    assert "ib_fw" not in got
    old = drift.versions({"ib": {"versions": {"fw_ver": {"mlx5_0": "28.39.1002"}}}})
    assert old == {"ib_fw": "28.39.1002"}
    hostile = {"fw_ver": {"mlx5_0": "28.39.1002"}, "product": ["not", "a", "dict"]}
    assert drift.versions({"ib": {"versions": hostile}}) == {"ib_fw": "28.39.1002"}


def test_firmware_of_another_product_is_no_drift():
    """An iWARP NIC's firmware beside the Mellanox HCAs' (one node of 64 has one) is compared
    with nobody's Mellanox firmware; an old ConnectX-7 firmware is named with its product."""
    found = {n: dict(v, **{"ib_fw:MT4129": "28.39.1002"}) for n, v in fleet().items()}
    found["a009"] = dict(found["a009"], **{"ib_fw:cxgb4": "1.27.5.0"})
    assert drift.odd_nodes(found)["odd"] == []
    found["a010"] = dict(found["a010"], **{"ib_fw:MT4129": "28.36.1010"})
    assert drift.odd_nodes(found)["odd"] == [
        f"a010: IB firmware (MT4129) 28.36.1010 vs 28.39.1002 on 63 of 63 peers ({H100})"
    ]
    items = {i["what"]: i for i in drift.odd_nodes(found)["items"]}
    assert items["IB firmware (cxgb4)"]["nodes"] == 1
    assert items["IB firmware (MT4129)"]["nodes"] == 64


def test_a_firmware_rollout_is_told_per_product():
    """A newer ConnectX-7 firmware on a few nodes is a rollout's start, as for the plain key."""
    found = {n: dict(v, **{"ib_fw:MT4129": "28.39.1002"}) for n, v in fleet().items()}
    for node in ("a001", "a002", "a003"):
        found[node] = dict(found[node], **{"ib_fw:MT4129": "28.41.1000"})
    out = drift.odd_nodes(found)
    assert out["odd"] == []
    (item,) = [i for i in out["items"] if i["what"] == "IB firmware (MT4129)"]
    assert item["rolling"] == [{"value": "28.41.1000", "nodes": 3, "stage": "new"}]

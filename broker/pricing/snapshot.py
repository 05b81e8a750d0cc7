"""Read the published catalog snapshots (AWS, GCP, Azure CSVs) into one normalized table.

Every price source (these snapshots, and the live adapters) produces rows with COLUMNS;
the catalog turns rows into Offers. Prices are USD per hour per instance.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pandas as pd

from broker.domain.accelerators import ACCELERATORS
from broker.domain.errors import BrokerError

COLUMNS = [
    "cloud",
    "region",
    "zone",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "gpu_memory_gb",
    "vcpus",
    "memory_gb",
    "on_demand_usd_per_h",
    "spot_usd_per_h",
]

FILES = {"aws": "aws_gpu_vms.csv", "gcp": "gcp_gpu_vms.csv", "azure": "azure_gpu_vms.csv"}

# GCP host machine families and the accelerator they carry (SOURCE.md, "How a GCP GPU VM
# is priced"). a3-ultragpu (H200) has no accelerator price in the snapshot, so it is left
# out rather than offered at its host price alone.
_GCP_HOST_GPU = [
    (r"^a2-(highgpu|megagpu)-(\d+)g$", "A100"),
    (r"^a2-ultragpu-(\d+)g$", "A100-80GB"),
    (r"^a3-(highgpu|edgegpu)-(\d+)g(-nolssd)?$", "H100"),
    (r"^a3-megagpu-(\d+)g$", "H100-MEGA"),
]
# g2-standard-N: GPUs per machine type, from GCP's G2 machine-type table.
_GCP_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}

# The SkyPilot catalog's columns (all three clouds use these names) -> ours.
_RENAME = {
    "InstanceType": "instance_type",
    "AcceleratorName": "accelerator",
    "AcceleratorCount": "accelerator_count",
    "vCPUs": "vcpus",
    "MemoryGiB": "memory_gb",
    "Price": "on_demand_usd_per_h",
    "SpotPrice": "spot_usd_per_h",
    "Region": "region",
    "AvailabilityZone": "zone",
}

AWS_COLUMNS = tuple(_RENAME)  # a catalog CSV in AWS's vms.csv format has these

# Known errors in the source rows, corrected here (the CSVs stay verbatim).
# ND96isr_H100_v5 has 8 H100 GPUs (Azure ND H100 v5 documentation); the source says 12.
_AZURE_COUNT_FIXES = {"Standard_ND96isr_H100_v5": 8}


def packaged_dir() -> Path:
    """The snapshot CSVs shipped inside the package."""
    return Path(str(resources.files("broker.pricing") / "data"))


def normalized(frame: pd.DataFrame, cloud: str) -> pd.DataFrame:
    """Rows of one cloud in COLUMNS order with numeric types and per-GPU memory (every price source ends here)."""
    frame = frame.assign(cloud=cloud)
    frame["accelerator_count"] = frame["accelerator_count"].astype(int)
    frame["gpu_memory_gb"] = frame["accelerator"].map(lambda a: ACCELERATORS[a].memory_gb)
    for col in ("vcpus", "memory_gb", "on_demand_usd_per_h", "spot_usd_per_h"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame[COLUMNS].reset_index(drop=True)


def load_aws(path: Path) -> pd.DataFrame:
    """AWS rows: one per instance type and AZ ID (zone IDs such as use1-az1)."""
    raw = pd.read_csv(path, dtype={"AvailabilityZone": str})
    raw = raw.drop_duplicates(["InstanceType", "AvailabilityZone"], keep="first")
    return normalized(raw.rename(columns=_RENAME), "aws")


def _gcp_host_gpu(instance_type: str) -> tuple[str, int] | None:
    for pattern, accelerator in _GCP_HOST_GPU:
        match = re.match(pattern, instance_type)
        if match:
            count = next(int(g) for g in match.groups() if g and g.isdigit())
            return accelerator, count
    g2 = re.match(r"^g2-standard-(\d+)$", instance_type)
    if g2 and int(g2.group(1)) in _GCP_G2_GPUS:
        return "L4", _GCP_G2_GPUS[int(g2.group(1))]
    return None


def load_gcp(path: Path) -> pd.DataFrame:
    """GCP rows: host machine price + accelerator price for the same zone and GPU count."""
    raw = pd.read_csv(path)
    hosts = raw[raw["InstanceType"].notna()].copy()
    gpus = raw[raw["InstanceType"].isna()].copy()
    shapes = hosts["InstanceType"].map(_gcp_host_gpu)
    hosts = hosts[shapes.notna()].copy()
    hosts["accelerator"] = [s[0] for s in shapes.dropna()]
    hosts["accelerator_count"] = [s[1] for s in shapes.dropna()]
    gpus = gpus.rename(columns={"AcceleratorName": "accelerator", "AcceleratorCount": "accelerator_count"})
    gpus["accelerator_count"] = gpus["accelerator_count"].astype(int)
    joined = hosts.drop(columns=["AcceleratorName", "AcceleratorCount"]).merge(
        gpus[["AvailabilityZone", "accelerator", "accelerator_count", "Price", "SpotPrice"]],
        on=["AvailabilityZone", "accelerator", "accelerator_count"],
        suffixes=("_host", "_gpu"),
    )
    frame = pd.DataFrame(
        {
            "region": joined["Region"],
            "zone": joined["AvailabilityZone"],
            "instance_type": joined["InstanceType"],
            "accelerator": joined["accelerator"],
            "accelerator_count": joined["accelerator_count"],
            "vcpus": joined["vCPUs"],
            "memory_gb": joined["MemoryGiB"],
            "on_demand_usd_per_h": joined["Price_host"] + joined["Price_gpu"],
            "spot_usd_per_h": joined["SpotPrice_host"] + joined["SpotPrice_gpu"],
        }
    )
    return normalized(frame, "gcp")


def load_azure(path: Path) -> pd.DataFrame:
    """Azure rows: one per VM size and region (the snapshot has no zones)."""
    raw = pd.read_csv(path)
    frame = raw.rename(columns=_RENAME)
    frame["zone"] = None
    fixes = frame["instance_type"].map(_AZURE_COUNT_FIXES)
    frame["accelerator_count"] = fixes.fillna(frame["accelerator_count"])
    return normalized(frame, "azure")


LOADERS = {"aws": load_aws, "gcp": load_gcp, "azure": load_azure}


def load_snapshot(directory: Path | None = None) -> pd.DataFrame:
    """All three clouds' snapshot rows from `directory` (default: the packaged copy)."""
    directory = Path(directory) if directory else packaged_dir()
    missing = [name for name in FILES.values() if not (directory / name).is_file()]
    if missing:
        raise BrokerError(
            f"BROKER_PRICES_DIR: {directory} lacks {', '.join(missing)}; point it at a folder of the clouds' "
            "snapshot CSVs (as broker/pricing/data), or unset it"
        )
    frames = [LOADERS[cloud](directory / name) for cloud, name in FILES.items()]
    return pd.concat(frames, ignore_index=True)

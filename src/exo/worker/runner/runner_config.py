"""What a runner is started with: the model, its shard, its caches and how it decodes."""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from exo.shared.types.common import ModelId
from exo.shared.types.cpu_kernels import CpuKernelsSetting, CpuWeightsSetting
from exo.shared.types.tls_link import TlsLinkConfig
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment


@dataclass(frozen=True)
class RunnerConfig:
    model_id: ModelId
    model_path: Path
    shard: ShardAssignment = field(default_factory=ShardAssignment)
    queue_limit: int = 64
    prefix_cache_bytes: int = 0
    prefix_cache_dir: Path | None = None
    """Where the runner keeps KV snapshots on disk (None: it keeps none)."""
    prefix_cache_disk_bytes: int = 0
    tool_format_override: str | None = None
    log_level: int = logging.INFO
    trust_remote_code: bool = False
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    """How the runner decodes, handed to it whole (it may allow a smaller batch for a model that cannot batch)."""
    cpu_kernels: CpuKernelsSetting = "auto"
    """The CPU engine's replacements (engines/mlx/cpu): `auto` on a Linux CPU machine, `off` nowhere."""
    cpu_weights: CpuWeightsSetting = "float32"  # `auto` is resolved by the runner, for its model
    """How the CPU engine holds the weights: float32, or int8 with a scale per output row."""
    pipeline_tls: TlsLinkConfig | None = field(default=None, repr=False)
    """A keyed cluster's certificates, for a pipeline rank's TLS relay (None: the ranks' sockets are plain TCP)."""

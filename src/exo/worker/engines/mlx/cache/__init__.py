"""KV-cache reuse across requests: keep the caches of recent prompts and prefill only what is new."""

from exo.worker.engines.mlx.cache.prefix_cache import CacheLease, PrefixCache

__all__ = ["CacheLease", "PrefixCache"]

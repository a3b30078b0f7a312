from tests.worker.engines.mlx.cpu.platform_gate import linux_cpu_machine

__all__ = ["linux_cpu_machine"]

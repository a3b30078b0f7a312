"""A node: the API, the master and the worker in one process, with one runner subprocess per model."""

import logging
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskGroup

from exo.master.main import Master
from exo.models.progress import PreparationTracker
from exo.models.progress_display import ConsoleProgress
from exo.models.resolve import ResolvedModel, model_id_for, resolve_model
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.events import PreparationUpdated
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.state import NodeInfo
from exo.worker.main import Worker
from exo.worker.runner.supervisor import RunnerConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeConfig:
    models: tuple[str | None, ...] = (None,)
    models_dir: Path | None = None
    host: str = "127.0.0.1"
    api_port: int = 52415
    api_key: str | None = None
    queue_limit: int = 64
    batch_size: int = 8
    speculation: bool = True
    prefix_cache_bytes: int = 2 * 1024**3
    tool_format_override: str | None = None
    max_request_bytes: int = 32 * 1024 * 1024
    log_level: int = logging.INFO
    # Let a model's own Python code run while loading (config.json `model_file`, tokenizer auto_map): off unless asked.
    trust_remote_code: bool = False
    extra_runner_configs: tuple[RunnerConfig, ...] = field(default_factory=tuple)


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        hostname = socket.gethostname()
        node = NodeInfo(
            node_id=NodeId(hostname), hostname=hostname, platform=platform.platform(), api_port=config.api_port
        )
        self.master = Master(node)
        self.preparing: set[str] = set()
        self.preparation_errors: dict[str, str] = {}
        self._worker: Worker | None = None
        # Downloads and conversions show on the console (a bar on a terminal) and in /state.
        self._console_progress = ConsoleProgress()

    async def start(self, task_group: TaskGroup) -> None:
        """Start the worker and, in the background, prepare and load each configured model."""
        self._worker = Worker(task_group, self.master.on_event)
        self.master.attach_worker(self._worker)
        for spec in self.config.models:
            task_group.start_soon(self._prepare_and_load, spec)
        for runner_config in self.config.extra_runner_configs:
            self._worker.start_runner(runner_config)

    async def stop(self) -> None:
        self._console_progress.close()
        if self._worker is not None:
            await self._worker.stop()

    async def _prepare_and_load(self, spec: str | None) -> None:
        label = spec or "default"
        self.preparing.add(label)
        assert self._worker is not None
        try:
            resolved = await anyio.to_thread.run_sync(self._resolve_with_progress, spec)
        except Exception as error:
            # Keep serving the other models; this one shows up in /state as failed and its requests get a 503
            # that names the reason.
            logger.error("cannot prepare model %s: %s", label, error)
            self.preparation_errors[label] = str(error)
            reason = f"cannot prepare model {label}: {error}"
            self._worker.add_unavailable_runner(self._runner_config(model_id_for(spec), Path(spec or label)), reason)
            return
        finally:
            self.preparing.discard(label)
        self._worker.start_runner(self._runner_config(resolved.model_id, resolved.path))

    def _resolve_with_progress(self, spec: str | None) -> ResolvedModel:
        """Runs in a worker thread: resolve `spec`, publishing download and conversion progress as it goes."""
        tracker = PreparationTracker(model_id_for(spec), (self._console_progress, self._publish_preparation))
        try:
            resolved = resolve_model(spec, self.config.models_dir, tracker)
        except Exception as error:
            if tracker.last is not None:
                tracker.fail(str(error))
            raise
        if tracker.last is not None:
            tracker.finish()
        return resolved

    def _publish_preparation(self, preparation: ModelPreparation) -> None:
        # Called from the preparing thread: the state is only ever changed on the event loop.
        anyio.from_thread.run_sync(self.master.on_event, PreparationUpdated(preparation=preparation))

    def _runner_config(self, model_id: ModelId, model_path: Path) -> RunnerConfig:
        return RunnerConfig(
            model_id=model_id,
            model_path=model_path,
            queue_limit=self.config.queue_limit,
            batch_size=self.config.batch_size,
            speculation=self.config.speculation,
            prefix_cache_bytes=self.config.prefix_cache_bytes,
            tool_format_override=self.config.tool_format_override,
            log_level=self.config.log_level,
            trust_remote_code=self.config.trust_remote_code,
        )

    def resolve_request_model(self, requested: str | None) -> ModelId | None:
        """The served model a request names (or the only one, when it names none)."""
        served = self.master.model_ids()
        if requested is None or requested == "":
            return served[0] if len(served) == 1 else None
        return ModelId(requested) if requested in served else None

"""The models as Ollama's clients list them: /api/tags (served in the cluster), /api/ps (loaded), /api/show.

exo has no Ollama blobs: `digest` is a hash of the model's name (stable, so clients that key on it work), and
names carry no tag; a request naming `model:latest` finds `model`. As Ollama does, `details` give the architecture
as `family` (qwen2, llama), `parameter_size` (494.03M, 7.6B), `quantization_level` (Q4, Q8 for MLX quantized
weights, else BF16, F16, F32) and `size` the weight files' bytes, from what the runner read of the checkpoint (a
model split over nodes is described by its whole checkpoint, as placed). /api/ps, like Ollama's, gives as `size` the
memory the loaded weights take instead: /v1/models' `memory_bytes`, for how the nodes hold them (float32 or int8 on a
Linux CPU per `--cpu-weights`).
"""

import hashlib

from exo.api.completion_flow import model_description, served_model
from exo.api.model_cards import model_memory
from exo.api.ollama.answer import created_at
from exo.api.types.ollama import OllamaModelDetails, OllamaModelEntry, OllamaModelList, OllamaShowAnswer
from exo.master.placement import served_model_ids
from exo.shared.types.common import ModelId
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import CheckpointFacts, ModelDescription

# The Ollama version exo's API corresponds to: clients (VS Code Copilot) refuse servers older than they need.
OLLAMA_API_VERSION = "0.12.6"
# How long /api/ps says a loaded model stays: exo keeps its models until the node stops.
_FOREVER = "2318-01-01T00:00:00Z"
_LATEST = ":latest"


def served_ollama_model(state: State, requested: str) -> ModelId:
    """The served model a request names, where Ollama's default tag (`name:latest`) names the untagged model."""
    served = served_model_ids(state)
    if requested.endswith(_LATEST) and requested not in served:
        requested = requested.removesuffix(_LATEST)
    return served_model(state, requested)


def _digest(model_id: str) -> str:
    return hashlib.sha256(model_id.encode()).hexdigest()


def human_number(count: int) -> str:
    """A parameter count as Ollama writes it: 7B, 7.6B, 494.03M, 500M, 12K."""
    for scale, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{suffix}" if number == int(number) else f"{number:.{decimals}f}{suffix}"
    return str(count)


def _checkpoint(state: State, model_id: ModelId, metadata: ModelDescription | None) -> CheckpointFacts | None:
    """The checkpoint as a whole: a rank of a split model read only its own files, the placement knows them all."""
    checkpoint = metadata.checkpoint if metadata else None
    placed = [instance for instance in state.instances.values() if instance.model_id == model_id]
    if checkpoint is None or not placed:
        return checkpoint
    footprint = max(placed, key=lambda instance: instance.placed_at).footprint
    return checkpoint.model_copy(
        update={
            "parameter_count": footprint.shared_parameters + sum(footprint.layer_parameters),
            "file_bytes": footprint.shared_file_bytes + sum(footprint.layer_file_bytes),
        }
    )


def _details(checkpoint: CheckpointFacts | None) -> OllamaModelDetails:
    family = checkpoint.family if checkpoint else "unknown"
    return OllamaModelDetails(
        format="mlx",
        family=family,
        families=[family],
        parameter_size=human_number(checkpoint.parameter_count) if checkpoint else "",
        quantization_level=checkpoint.quantization if checkpoint else "",
    )


def _entry(state: State, model_id: ModelId, now: str, *, loaded: bool) -> OllamaModelEntry:
    metadata = model_description(state, model_id)
    checkpoint = _checkpoint(state, model_id, metadata)
    size = checkpoint.file_bytes if checkpoint else 0
    if loaded:
        _, memory = model_memory(state, model_id)
        size = size if memory is None else memory
    return OllamaModelEntry(
        name=model_id,
        model=model_id,
        modified_at=now,
        size=size,
        digest=_digest(model_id),
        details=_details(checkpoint),
        expires_at=_FOREVER if loaded else None,
        size_vram=0 if loaded else None,
        context_length=metadata.context_length if loaded and metadata else None,
    )


def tags(state: State) -> OllamaModelList:
    """Every model served anywhere in the cluster."""
    now = created_at()
    return OllamaModelList(models=[_entry(state, model_id, now, loaded=False) for model_id in served_model_ids(state)])


def loaded(state: State) -> OllamaModelList:
    """The served models a runner has loaded and can generate with now."""
    ready = {runner.model_id for runner in state.runners.values() if runner.status in ("ready", "running")}
    now = created_at()
    models = [model_id for model_id in served_model_ids(state) if model_id in ready]
    return OllamaModelList(models=[_entry(state, model_id, now, loaded=True) for model_id in models])


def show(state: State, model_id: ModelId) -> OllamaShowAnswer:
    """What clients read before chatting: the context length (`<family>.context_length`) and the capabilities
    (`tools` makes VS Code Copilot offer the model in agent mode)."""
    metadata = model_description(state, model_id)
    checkpoint = _checkpoint(state, model_id, metadata)
    details = _details(checkpoint)
    info: dict[str, str | int] = {"general.architecture": details.family, "general.basename": model_id}
    if checkpoint is not None:
        info["general.parameter_count"] = checkpoint.parameter_count
    capabilities = ["completion"]
    if metadata is not None:
        info[f"{details.family}.context_length"] = metadata.context_length
        if metadata.tool_format is not None:
            capabilities.append("tools")
        if metadata.supports_reasoning:
            capabilities.append("thinking")
    return OllamaShowAnswer(modified_at=created_at(), details=details, model_info=info, capabilities=capabilities)

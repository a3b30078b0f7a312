"""GET /v1/models' cards: one per model served anywhere in the cluster, with the memory its weights take as the
nodes serving it hold them (the same computation as placement and the catalog: `footprint.held_bytes`), and one per
model a node is still preparing (downloading, assembling, converting) before any runner serves it: a client that
lists the models right after `exo` starts finds the model it will be served."""

import time

from exo.master.placement import models_in_preparation, served_model_ids
from exo.shared.types.api import ModelCard
from exo.shared.types.common import ModelId
from exo.shared.types.footprint import WeightsInMemory, held_as, held_bytes
from exo.shared.types.state import RunnerInfo, State


def describing_runners(state: State) -> dict[ModelId, RunnerInfo]:
    """A runner for each model served anywhere in the cluster: a loaded one when there is one, else one that has
    described the model while loading."""
    served = served_model_ids(state)
    described: dict[ModelId, RunnerInfo] = {}
    for runner in state.runners.values():
        if runner.model_id in served:
            known = described.get(runner.model_id)
            if known is None or _how_described(runner) > _how_described(known):
                described[runner.model_id] = runner
    return described


def _how_described(runner: RunnerInfo) -> int:
    return 2 if runner.metadata is not None else 1 if runner.description is not None else 0


def model_memory(state: State, model_id: ModelId) -> tuple[WeightsInMemory | None, int | None]:
    """How the cluster holds `model_id`'s weights and their memory (`weights_memory`); (None, None) if not served."""
    runner = describing_runners(state).get(model_id)
    return (None, None) if runner is None else weights_memory(state, runner)


def model_cards(state: State) -> list[ModelCard]:
    """One card per model served anywhere in the cluster (described by a loaded runner when there is one), and one
    per model being prepared that no runner serves yet, by id."""
    described = describing_runners(state)
    cards = [_served_card(state, model_id, runner) for model_id, runner in described.items()]
    cards.extend(
        ModelCard(
            id=model_id, created=int(time.time()), capabilities=["chat"], status="preparing", preparation=progress
        )
        for model_id, progress in models_in_preparation(state).items()
        if model_id not in described
    )
    return sorted(cards, key=lambda card: card.id)


def _served_card(state: State, model_id: ModelId, runner: RunnerInfo) -> ModelCard:
    metadata = runner.described
    capabilities = ["chat"]
    if metadata is not None and metadata.tool_format is not None:
        capabilities.append("tool_use")
    if metadata is not None and metadata.supports_reasoning:
        capabilities.append("reasoning")
    weights, memory = weights_memory(state, runner)
    return ModelCard(
        id=model_id,
        created=int(time.time()),
        capabilities=capabilities,
        context_length=metadata.context_length if metadata else None,
        vocab_size=metadata.vocab_size if metadata else None,
        weights_in_memory=weights,
        memory_bytes=memory,
        status=runner.status,
        error=runner.last_error if runner.status == "failed" else None,
    )


def weights_memory(state: State, runner: RunnerInfo) -> tuple[WeightsInMemory | None, int | None]:
    """How `runner`'s instance holds the weights and their memory over all its ranks: a placed instance's from its
    footprint and each rank's node, a whole model's from the checkpoint the runner read (while it loads: the memory
    the weights will take). (None, None) while unknown (a runner that has not read its model yet, or a node that
    left)."""
    instance = state.instances.get(runner.instance_id)
    if instance is not None:
        nodes = [state.nodes.get(rank.node_id) for rank in instance.ranks]
        held: list[WeightsInMemory] = [node.facts.weights_in_memory for node in nodes if node is not None]
        if len(held) != len(instance.ranks):
            return None, None
        held = [instance.footprint.held_as(weights) for weights in held]  # `auto` resolved for this model
        memory = sum(
            instance.footprint.rank_bytes(rank.start_layer, rank.end_layer, weights=weights)
            for rank, weights in zip(instance.ranks, held, strict=True)
        )
        shared: WeightsInMemory | None = held[0] if all(weights == held[0] for weights in held) else None
        return shared, memory
    node = state.nodes.get(runner.node_id)
    description = runner.described
    checkpoint = description.checkpoint if description is not None else None
    if node is None or checkpoint is None:
        return None, None
    weights = held_as(node.facts.weights_in_memory, gguf_kept=checkpoint.gguf_bytes is not None)
    return weights, held_bytes(checkpoint.parameter_count, checkpoint.stored_bytes(weights), weights=weights)

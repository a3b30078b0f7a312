"""The host-overhead meter's parts in the step where requests join a batch (tiny-qwen-tools fixture, real forward
passes): their first step is mlx-lm's own (`PromptProcessingBatch.generate`), which builds a forward pass and its
sample in Python; that is counted as `graph`, as the batch's later steps are, not left to the loop's remainder."""

from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, user
from tests.worker.engines.mlx.generator.scheduling import MAX_STEPS, engine_context, task


def test_the_step_where_requests_join_the_batch_counts_their_first_pass_as_graph() -> None:
    settings = DecodeSettings(batch_size=4, speculation=None)
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", settings)
    scheduler = GenerationScheduler(context.loaded.model, settings)
    arriving = [task({"messages": [user(f"Hello! Count to {n}.")], "max_tokens": 6}) for n in range(3)]
    for one in arriving:
        scheduler.admit(ChatRequest.open(context, one))
    first_token_steps: list[dict[StepPart, float]] = []
    for _ in range(MAX_STEPS):
        STEP_CLOCK.begin()
        updates = scheduler.step()
        _, parts = STEP_CLOCK.end()
        if any(update.generated_tokens == 1 for update in updates):
            first_token_steps.append(parts)
        if scheduler.active == 0:
            break
    # All three prefilled together and joined the batch at once: their first tokens came from mlx-lm's join step,
    # with no step of the batch's own before it (nothing decoded yet) to build a graph.
    assert len(first_token_steps) == 1, first_token_steps
    (joined,) = first_token_steps
    assert joined.get("graph", 0.0) > 0, joined
    assert joined.get("device", 0.0) > 0, joined

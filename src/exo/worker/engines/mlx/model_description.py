"""What a model's files and tokenizer say about it (`ModelDescription`), read before its weights load."""

import json
import logging
from pathlib import Path
from typing import cast

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.models.checkpoint_facts import checkpoint_facts
from exo.models.footprint import FootprintError
from exo.shared.types.worker.runner_response import CheckpointFacts, ModelDescription
from exo.tool_calls import detect_tool_format
from exo.worker.engines.mlx.chat_template import chat_template_text
from exo.worker.engines.mlx.model_loader import model_context_length, model_vocabulary_size

logger = logging.getLogger(__name__)


def describe_model(model_path: Path, tokenizer: TokenizerWrapper, tool_format_override: str | None) -> ModelDescription:
    """The model's context length, tool-call format (raises ValueError for an override naming no format), reasoning
    and checkpoint, as the loaded runner reports them."""
    tool_format = detect_tool_format(
        chat_template_text(tokenizer),
        _read_tool_parser_type(model_path),
        tool_format_override,
        vocabulary=cast(dict[str, int], tokenizer.get_vocab()),
    )
    return ModelDescription(
        context_length=model_context_length(model_path),
        tool_format=str(tool_format),
        supports_reasoning=tokenizer.has_thinking,
        vocab_size=model_vocabulary_size(model_path, tokenizer),
        checkpoint=_checkpoint(model_path),
    )


def _read_tool_parser_type(model_path: Path) -> str | None:
    config_path = model_path / "tokenizer_config.json"
    if not config_path.exists():
        return None
    value: object = json.loads(config_path.read_text()).get("tool_parser_type")
    return value if isinstance(value, str) else None


def _checkpoint(model_path: Path) -> CheckpointFacts | None:
    """What model listings show of the checkpoint; a listing without it is no reason to fail the load."""
    try:
        return checkpoint_facts(model_path)
    except (FootprintError, OSError) as error:
        logger.warning("cannot describe the checkpoint in %s: %s", model_path, error)
        return None

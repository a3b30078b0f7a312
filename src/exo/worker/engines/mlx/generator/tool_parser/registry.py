"""Which plug-in reads which format."""

from exo.worker.engines.mlx.generator.tool_parser.format_name import ToolFormatName
from exo.worker.engines.mlx.generator.tool_parser.hermes import HermesFormat
from exo.worker.engines.mlx.generator.tool_parser.llama3_json import Llama3JsonFormat
from exo.worker.engines.mlx.generator.tool_parser.mistral import MistralFormat
from exo.worker.engines.mlx.generator.tool_parser.mlx_lm_formats import MlxLmFormat
from exo.worker.engines.mlx.generator.tool_parser.plugin import ToolFormat
from exo.worker.engines.mlx.generator.tool_parser.pythonic import PythonicFormat
from exo.worker.engines.mlx.generator.tool_parser.qwen3_coder import Qwen3CoderFormat

_OWN_FORMATS: dict[ToolFormatName, ToolFormat] = {
    ToolFormatName.HERMES: HermesFormat(),
    ToolFormatName.GENERIC: HermesFormat(),
    ToolFormatName.LLAMA3_JSON: Llama3JsonFormat(),
    ToolFormatName.MISTRAL: MistralFormat(),
    ToolFormatName.PYTHONIC: PythonicFormat(),
    ToolFormatName.QWEN3_CODER: Qwen3CoderFormat(),
}
# Parsed whole by mlx-lm's own module of the same name.
_MLX_LM_FORMATS: dict[ToolFormatName, ToolFormat] = {
    name: MlxLmFormat(name.value) for name in ToolFormatName if name not in _OWN_FORMATS
}


def format_for(name: ToolFormatName) -> ToolFormat:
    """The plug-in for `name`."""
    return _OWN_FORMATS.get(name) or _MLX_LM_FORMATS[name]

"""Which plug-in reads which format."""

from exo.tool_calls.format import ToolFormat
from exo.tool_calls.formats.hermes import HermesFormat
from exo.tool_calls.formats.llama3_json import Llama3JsonFormat
from exo.tool_calls.formats.mistral import MistralFormat
from exo.tool_calls.formats.mlx_lm import MlxLmFormat
from exo.tool_calls.formats.pythonic import PythonicFormat
from exo.tool_calls.formats.qwen3_coder import Qwen3CoderFormat
from exo.tool_calls.names import ToolFormatName

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

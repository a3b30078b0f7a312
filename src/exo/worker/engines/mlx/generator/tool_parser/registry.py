"""Which plug-in reads which format."""

from exo.worker.engines.mlx.generator.tool_parser.format_name import ToolFormatName
from exo.worker.engines.mlx.generator.tool_parser.hermes import HermesFormat
from exo.worker.engines.mlx.generator.tool_parser.llama3_json import Llama3JsonFormat
from exo.worker.engines.mlx.generator.tool_parser.plugin import ToolFormat

_FORMATS: dict[ToolFormatName, ToolFormat] = {
    ToolFormatName.HERMES: HermesFormat(),
    ToolFormatName.GENERIC: HermesFormat(),
    ToolFormatName.LLAMA3_JSON: Llama3JsonFormat(),
}


def format_for(name: ToolFormatName) -> ToolFormat:
    """The plug-in for `name`."""
    return _FORMATS[name]

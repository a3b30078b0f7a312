"""Which module reads which format: adding a model family is one module in formats/ and one line here."""

from exo.tool_calls.format import ToolFormat
from exo.tool_calls.formats.deepseek_v31 import DeepSeekV31Format
from exo.tool_calls.formats.deepseek_v32 import DEEPSEEK_V32
from exo.tool_calls.formats.gemma4 import FUNCTION_GEMMA, GEMMA4
from exo.tool_calls.formats.glm47 import GLM47
from exo.tool_calls.formats.harmony import HarmonyFormat
from exo.tool_calls.formats.hermes import HermesFormat
from exo.tool_calls.formats.kimi_k2 import KimiK2Format
from exo.tool_calls.formats.kimi_k3 import KIMI_K3
from exo.tool_calls.formats.llama3_json import Llama3JsonFormat
from exo.tool_calls.formats.longcat import LONGCAT
from exo.tool_calls.formats.minicpm5 import MINICPM5
from exo.tool_calls.formats.minimax_m2 import MINIMAX_M2
from exo.tool_calls.formats.mistral import MistralFormat
from exo.tool_calls.formats.muse_spark import MUSE_SPARK
from exo.tool_calls.formats.pythonic import PythonicFormat
from exo.tool_calls.formats.qwen3_coder import Qwen3CoderFormat
from exo.tool_calls.names import ToolFormatName

_FORMATS: dict[ToolFormatName, ToolFormat] = {
    ToolFormatName.HERMES: HermesFormat(),
    ToolFormatName.GENERIC: HermesFormat(),
    ToolFormatName.LLAMA3_JSON: Llama3JsonFormat(),
    ToolFormatName.MISTRAL: MistralFormat(),
    ToolFormatName.PYTHONIC: PythonicFormat(),
    ToolFormatName.QWEN3_CODER: Qwen3CoderFormat(),
    ToolFormatName.GLM47: GLM47,
    ToolFormatName.LAGUNA: GLM47,
    ToolFormatName.LONGCAT: LONGCAT,
    ToolFormatName.KIMI_K2: KimiK2Format(),
    ToolFormatName.KIMI_K3: KIMI_K3,
    ToolFormatName.MINIMAX_M2: MINIMAX_M2,
    ToolFormatName.GEMMA4: GEMMA4,
    ToolFormatName.FUNCTION_GEMMA: FUNCTION_GEMMA,
    ToolFormatName.MINICPM5: MINICPM5,
    ToolFormatName.MUSE_SPARK: MUSE_SPARK,
    ToolFormatName.HARMONY: HarmonyFormat(),
    ToolFormatName.DEEPSEEK_V31: DeepSeekV31Format(),
    ToolFormatName.DEEPSEEK_V32: DEEPSEEK_V32,
}


def format_for(name: ToolFormatName) -> ToolFormat:
    """The format module's plug-in for `name`."""
    return _FORMATS[name]

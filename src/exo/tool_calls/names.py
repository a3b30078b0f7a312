"""The names of the tool-call formats the parser understands."""

from enum import StrEnum


class ToolFormatName(StrEnum):
    """A tool-call wire format; values match mlx-lm's `tool_parser_type` where mlx-lm has one."""

    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"
    MISTRAL = "mistral"
    PYTHONIC = "pythonic"
    QWEN3_CODER = "qwen3_coder"
    GLM47 = "glm47"
    LAGUNA = "laguna"
    KIMI_K2 = "kimi_k2"
    KIMI_K3 = "kimi_k3"
    MINIMAX_M2 = "minimax_m2"
    GEMMA4 = "gemma4"
    FUNCTION_GEMMA = "function_gemma"
    LONGCAT = "longcat"
    MINICPM5 = "minicpm5"
    MUSE_SPARK = "muse_spark"
    HARMONY = "harmony"
    DEEPSEEK_V31 = "deepseek_v31"
    DEEPSEEK_V32 = "deepseek_v32"
    GENERIC = "generic"

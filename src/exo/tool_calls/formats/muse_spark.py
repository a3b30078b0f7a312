"""Muse Spark (XML_ATEM): `<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="K">V
</atem:parameter></atem:invoke></atem:function_calls>`."""

from exo.tool_calls.formats.minimax_m2 import invoke_format

MUSE_SPARK = invoke_format("<atem:function_calls>", "</atem:function_calls>", "atem:", "muse_spark", newline="")

"""LongCat: GLM's layout with `longcat_`-prefixed tags (`<longcat_tool_call>NAME\\n<longcat_arg_key>…`)."""

from exo.tool_calls.formats.glm47 import key_value_format

LONGCAT = key_value_format("longcat_", "longcat")

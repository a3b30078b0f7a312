"""Constrained-decoding costs in their own process: `python -m bench.constrained_worker SETUP_JSON`.

The parent starts it with exo's runner environment (`blas_environment`: the optimized BLAS must be preloaded before
mlx is imported). It loads the model as exo's runner does, then measures with the runner's own functions:
`constraint_spec` + `make_logits_processor` (grammar build and compile) and `generate_tokens` (decode), and prints one
`ConstrainedReport` JSON line on stdout.

Decode runs share one prompt. It is prefilled once; every run then restarts from that prompt cache rewound to the
prompt minus its last token, so a run costs only its decode (exo's prefix cache does the same for a repeated prompt).
"""

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from pydantic import BaseModel

from bench.machine import exo_commit
from bench.results import ConstrainedDecodeRow, ConstrainedReport, ConstrainedSettings, GrammarCompileRow
from exo.api.types.openai_chat import ToolDefinition
from exo.shared.types.tasks import PromptMessage, SamplingParams, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.shards import ShardAssignment
from exo.tool_calls import ToolFormatName, detect_tool_format
from exo.tool_calls.grammar.policy import RequestTools, constraint_spec
from exo.worker.engines.mlx.chat_template import apply_chat_template, chat_template_text
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.constrained.compiled import compiled_template, guidance_tokenizer
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.generator.generate import LogitsProcessor, generate_tokens
from exo.worker.engines.mlx.generator.request_context import reasoning_markers
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model

NAMED_TOOL = "write"
"""The tool forced by the named-choice mode; the decode prompt asks for it, so every mode writes the same call."""
UNCONSTRAINED = "tool_choice auto (unconstrained)"
_SYSTEM = "You are a coding agent. Use the tools to act on the user's files."
_USER = (
    "Create the file notes/hash_tables.md: a detailed explanation of how hash tables work (hashing, chaining, "
    "open addressing, load factor, resizing), at least 40 lines of Markdown. Use the write tool."
)


class ConstrainedSetup(BaseModel):
    model_path: Path
    tools_path: Path
    """A JSON list of OpenAI tool definitions (the captured opencode tool set)."""
    settings: ConstrainedSettings


def load_tools(path: Path) -> tuple[ToolSpec, ...]:
    """The functions of a JSON list of OpenAI `tools` entries."""
    entries = cast(list[object], json.loads(path.read_text()))
    return tuple(ToolDefinition.model_validate(entry).function.tool_spec() for entry in entries)


def schema_chars(tools: Sequence[ToolSpec]) -> int:
    """Size of what the grammar is built from: each tool's JSON as the request carried it."""
    return sum(len(tool.model_dump_json(exclude_none=True)) for tool in tools)


def decode_policies(tools: tuple[ToolSpec, ...]) -> dict[str, ToolPolicy]:
    """The modes compared, unconstrained first: the same tools offered (so the same prompt), different tool_choice."""
    return {
        UNCONSTRAINED: ToolPolicy(tools=tools, mode="auto"),
        'tool_choice "required"': ToolPolicy(tools=tools, mode="required"),
        f'tool_choice named "{NAMED_TOOL}"': ToolPolicy(tools=tools, callable_tools=(NAMED_TOOL,), mode="named"),
    }


class _Decoder:
    """The decode prompt prefilled once; `run` decodes from it under a policy and rewinds the cache afterwards."""

    def __init__(self, loaded: LoadedModel, tool_format: ToolFormatName, tools: tuple[ToolSpec, ...]) -> None:
        self.loaded = loaded
        self.tool_format = tool_format
        messages = (PromptMessage(role="system", content=_SYSTEM), PromptMessage(role="user", content=_USER))
        rendered = {
            mode: apply_chat_template(loaded.tokenizer, messages, policy)
            for mode, policy in decode_policies(tools).items()
        }
        prompts = {tuple(prompt.tokens) for prompt in rendered.values()}
        if len(prompts) != 1:
            raise RuntimeError("the chat template renders different prompts for different tool_choice modes")
        first = next(iter(rendered.values()))
        self.prompt = first.tokens
        self.reasoning = reasoning_markers(loaded.tokenizer, first.starts_in_reasoning)
        self._cache: list[Any] = make_prompt_cache(loaded.model)
        self._kept = len(self.prompt) - 1
        # Prefill all but the last prompt token; each run feeds that token, so each run samples from the prompt.
        for _ in generate_tokens(
            loaded, self.prompt, sampling=SamplingParams(), max_tokens=1, prompt_cache=self._cache
        ):
            pass
        self._rewind()

    def _rewind(self) -> None:
        excess = cast(int, self._cache[0].offset) - self._kept
        if excess > 0:
            trim_prompt_cache(self._cache, excess)

    def processors(self, policy: ToolPolicy) -> Sequence[LogitsProcessor]:
        """What the runner would pass to `generate_tokens` for this policy, given one uncached prompt token."""
        spec = constraint_spec(RequestTools.of(policy), None, self.tool_format, self.reasoning)
        return (make_logits_processor(self.loaded.tokenizer, spec, prompt_length=1),) if spec else ()

    def run(self, policy: ToolPolicy, max_tokens: int) -> tuple[float, list[int]]:
        """(ms per decoded token, tokens) of one greedy run; the processor is built before the clock starts."""
        processors = self.processors(policy)
        stamps: list[float] = []
        tokens: list[int] = []
        try:
            for response in generate_tokens(
                self.loaded,
                self.prompt[-1:],
                sampling=SamplingParams(),
                max_tokens=max_tokens,
                prompt_cache=self._cache,
                logits_processors=processors,
            ):
                stamps.append(time.perf_counter())
                tokens.append(response.token)
        finally:
            self._rewind()
        if len(stamps) < 2:
            raise RuntimeError(f"only {len(stamps)} token(s) generated: nothing to time")
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000.0, tokens


def measure_decode(
    decoder: _Decoder, policies: dict[str, ToolPolicy], settings: ConstrainedSettings
) -> list[ConstrainedDecodeRow]:
    """Every mode once per repeat, the order rotating each repeat so no mode always runs first or last."""
    modes = list(policies)
    timings: dict[str, list[float]] = {mode: [] for mode in modes}
    outputs: dict[str, list[int]] = {}
    for repeat in range(settings.repeats):
        shift = repeat % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            ms_per_token, tokens = decoder.run(policies[mode], settings.max_tokens)
            timings[mode].append(ms_per_token)
            outputs[mode] = tokens
    tokenizer = decoder.loaded.tokenizer
    return [
        ConstrainedDecodeRow(
            mode=mode,
            constrained=mode != UNCONSTRAINED,
            ms_per_token=timings[mode],
            median_ms_per_token=statistics.median(timings[mode]),
            completion_tokens=len(outputs[mode]),
            same_tokens_as_unconstrained=outputs[mode] == outputs[UNCONSTRAINED],
            text=cast(str, tokenizer.decode(outputs[mode])),
        )
        for mode in modes
    ]


def _elapsed_ms(decoder: _Decoder, policy: ToolPolicy) -> float:
    started = time.perf_counter()
    decoder.processors(policy)
    return (time.perf_counter() - started) * 1000.0


def measure_compile(
    decoder: _Decoder, tools: tuple[ToolSpec, ...], repeats: int
) -> tuple[float, float, list[GrammarCompileRow]]:
    """(first request ms, tokenizer build ms, per-mode compile rows) for requests offering `tools`.

    Must run before anything else built a constraint in this process, so the first request is really the first.
    """
    policies = {
        f'tool_choice "required", {len(tools)} tools': (ToolPolicy(tools=tools, mode="required"), tools),
        f'tool_choice named "{NAMED_TOOL}"': (
            ToolPolicy(tools=tools, callable_tools=(NAMED_TOOL,), mode="named"),
            tuple(tool for tool in tools if tool.name == NAMED_TOOL),
        ),
    }
    first_request = _elapsed_ms(decoder, next(iter(policies.values()))[0])
    tokenizer_builds: list[float] = []
    cold: dict[str, list[float]] = {mode: [] for mode in policies}
    cached: dict[str, list[float]] = {mode: [] for mode in policies}
    for _ in range(repeats):
        guidance_tokenizer.cache_clear()  # cold: no cached tokenizer or grammar
        compiled_template.cache_clear()
        started = time.perf_counter()
        guidance_tokenizer(decoder.loaded.tokenizer)
        tokenizer_builds.append((time.perf_counter() - started) * 1000.0)
        for mode, (policy, _callable) in policies.items():
            cold[mode].append(_elapsed_ms(decoder, policy))
            cached[mode].append(_elapsed_ms(decoder, policy))
    rows = [
        GrammarCompileRow(
            mode=mode,
            tool_count=len(callable_tools),
            schema_chars=schema_chars(callable_tools),
            cold_ms=statistics.median(cold[mode]),
            cached_ms=statistics.median(cached[mode]),
        )
        for mode, (_policy, callable_tools) in policies.items()
    ]
    return first_request, statistics.median(tokenizer_builds), rows


def measure(setup: ConstrainedSetup) -> ConstrainedReport:
    """Load the model and measure compile times, then decode speed per mode."""
    settings = setup.settings
    loaded = load_model(setup.model_path, ShardAssignment())
    if (planner := MatmulPlanner.for_loaded(loaded)) is not None:
        planner.finish()  # as exo's runner does while idle, before the bench measures it
    tool_format = detect_tool_format(chat_template_text(loaded.tokenizer))
    all_tools = load_tools(setup.tools_path)
    wanted = settings.decode_tools
    decode_tools = all_tools if wanted is None else tuple(tool for tool in all_tools if tool.name in wanted)
    decoder = _Decoder(loaded, tool_format, decode_tools)
    first_request, tokenizer_build, compile_rows = measure_compile(decoder, all_tools, settings.compile_repeats)
    decode = measure_decode(decoder, decode_policies(decode_tools), settings)
    load_1, load_5, load_15 = os.getloadavg()
    return ConstrainedReport(
        settings=settings,
        tool_format=tool_format,
        prompt_tokens=len(decoder.prompt),
        vocabulary_size=guidance_tokenizer(loaded.tokenizer).lltokenizer.vocab_size,
        decode=decode,
        first_request_ms=first_request,
        tokenizer_build_ms=tokenizer_build,
        compile=compile_rows,
        load_average=(load_1, load_5, load_15),
        exo_commit=exo_commit(),
    )


def main() -> None:
    report = measure(ConstrainedSetup.model_validate_json(sys.argv[1]))
    sys.stdout.write(report.model_dump_json() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

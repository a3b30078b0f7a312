"""Run sizes: the full run (10–15 minutes for a 0.5B model on 2 shared CPU cores) and the `--quick` smoke run."""

from bench.results import BenchSettings, ConstrainedSettings, SpeculationSettings

PARSER_SIZES = (1_000, 10_000, 100_000)

FULL = BenchSettings(
    quick=False,
    decode_max_tokens=64,
    decode_repeats=5,
    agent_system_chars=9_500,
    agent_tool_count=10,
    agent_turns=4,
    agent_max_tokens=24,
    parser_sizes=PARSER_SIZES,
    parser_segment_chars=4,
    parser_repeats=5,
    concurrency_levels=(1, 2, 4, 8),
    concurrency_max_tokens=32,
    concurrency_repeats=2,
    arrival_running_streams=3,
    arrival_max_tokens=48,
)

# The tiny fixture model has a 4,096-token context and a small vocabulary (about 2 characters a token), so the
# agent prompt is scaled down to fit; everything else only gets fewer tokens.
QUICK = BenchSettings(
    quick=True,
    decode_max_tokens=24,
    decode_repeats=2,
    agent_system_chars=2_000,
    agent_tool_count=3,
    agent_turns=4,
    agent_max_tokens=8,
    parser_sizes=PARSER_SIZES,
    parser_segment_chars=4,
    parser_repeats=1,
    concurrency_levels=(1, 2, 4),
    concurrency_max_tokens=8,
    concurrency_repeats=1,
    arrival_running_streams=2,
    arrival_max_tokens=16,
    pass_cost_repeats=2,
)

# The decode prompt offers the whole opencode tool set (about 21,000 characters of schemas), as opencode does; it is
# prefilled once and each run restarts from that cache, so only the first run pays the prefill.
CONSTRAINED_FULL = ConstrainedSettings(decode_tools=None, max_tokens=48, repeats=3, compile_repeats=5)

# The tiny fixture model's 4,096-token context cannot hold every opencode tool: its decode prompt offers `write` only.
# Grammar compile times use the whole tool set either way (compiling does not touch the model's context).
CONSTRAINED_QUICK = ConstrainedSettings(decode_tools=("write",), max_tokens=24, repeats=1, compile_repeats=2)

# Long enough that the edit's copied arguments dominate; the modes take turns within each repeat. The edit offers
# the tools an edit turn needs (`read`, `edit`, `write`): the whole opencode set makes a 13,700-token prompt whose
# prefill alone takes most of an hour on a busy 2-core machine, and adds nothing the decode speed depends on.
SPECULATION_FULL = SpeculationSettings(max_tokens=128, repeats=2, edit_tools=("read", "edit", "write"))
# The tiny fixture model's context holds `read` and `edit` only.
SPECULATION_QUICK = SpeculationSettings(max_tokens=24, repeats=1, edit_tools=("read", "edit"))

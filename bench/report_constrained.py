"""Render section 5, grammar-constrained decoding, as Markdown."""

import re

from bench.markdown import markdown_table
from bench.results import ConstrainedReport
from bench.targets import CONSTRAINED_SLOWDOWN_TARGET

CONSTRAINED_TITLE = "## 5. Grammar-constrained decoding"
_TEXT_EXCERPT_CHARS = 60


def _excerpt(text: str) -> str:
    """The start of a reply as an inline code span on one table line (newlines shown as \\n, pipes escaped)."""
    short = text[:_TEXT_EXCERPT_CHARS] + ("…" if len(text) > _TEXT_EXCERPT_CHARS else "")
    short = short.replace("\n", "\\n").replace("|", "\\|")
    # A code span closes on a backtick run of its own length: delimit with a run longer than any in the text
    # (replies often open with a ```json fence).
    fence = "`" * (max((len(run) for run in re.findall(r"`+", short)), default=0) + 1)
    return f"{fence} {short} {fence}"


def _decode(section: ConstrainedReport) -> list[str]:
    plain = next(row for row in section.decode if not row.constrained)
    rows = [
        [
            row.mode,
            f"{row.median_ms_per_token:.1f}",
            f"{row.median_ms_per_token / plain.median_ms_per_token:.3f}×",
            ", ".join(f"{value:.1f}" for value in row.ms_per_token),
            str(row.completion_tokens),
            "yes" if row.same_tokens_as_unconstrained else "no",
            _excerpt(row.text),
        ]
        for row in section.decode
    ]
    settings = section.settings
    offered = "the whole opencode tool set" if settings.decode_tools is None else ", ".join(settings.decode_tools)
    return [
        f"Decode speed, the same {section.prompt_tokens}-token prompt ({offered} offered, the user asks for a long "
        f"file written with `write`) under each `tool_choice`; greedy, max_tokens {settings.max_tokens}, "
        f"{settings.repeats} run(s) per mode, the modes taking turns in a rotating order. Timed in-process around "
        "exo's own `generate_tokens` with the processors `logits_processors_for` gives it (what the runner does); "
        "the prompt is prefilled once and every run restarts from that cache, and ms per token = (last token time − "
        "first token time) / (tokens − 1), so neither prefill nor grammar compile is in it. Target: at most "
        f"{CONSTRAINED_SLOWDOWN_TARGET:.2f}× the unconstrained median.",
        "",
        *markdown_table(
            ["Mode", "Median ms/token", "× unconstrained", "ms/token per run", "Tokens", "Same tokens", "Reply starts"],
            rows,
        ),
    ]


def _compile(section: ConstrainedReport) -> list[str]:
    rows = [
        [row.mode, str(row.tool_count), f"{row.schema_chars:,}", f"{row.cold_ms:.2f}", f"{row.cached_ms:.3f}"]
        for row in section.compile
    ]
    return [
        "Grammar build and compile for one request (`logits_processors_for`, which builds the grammar text, compiles "
        "it with llguidance and copies a fresh matcher), the tools being the captured opencode set; medians of "
        f"{section.settings.compile_repeats} repeats. Cold = the compiled-grammar cache emptied (the llguidance "
        "tokenizer already built); cached = the same request again.",
        "",
        *markdown_table(["Request", "Tools", "Schema characters", "Cold ms", "Cached ms"], rows),
        f"- First constrained request with no llguidance tokenizer built yet: **{section.first_request_ms:.0f} ms** "
        f"(building the tokenizer for the {section.vocabulary_size:,}-token vocabulary, "
        f"{section.tokenizer_build_ms:.0f} ms on its own, plus the compile). exo's runner builds it while it loads "
        "the model, so its first constrained request pays only the cold compile above.",
        "",
    ]


def render_constrained(section: ConstrainedReport) -> list[str]:
    """Section 5: decode slowdown per token and grammar compile times, with the state of the machine it ran on."""
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    return [
        CONSTRAINED_TITLE,
        "",
        f"Measured at commit {section.exo_commit}, tool-call format {section.tool_format}; load average (1, 5, 15 "
        f"min) at the end {load}.",
        "",
        *_decode(section),
        *_compile(section),
    ]

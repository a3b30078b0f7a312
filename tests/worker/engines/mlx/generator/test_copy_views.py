"""The forms a tool call copies conversation text in, and prompt-lookup drafts that follow them."""

from exo.shared.types.worker.decode_settings import LookupSettings
from exo.worker.engines.mlx.generator.copy_views import copy_views, json_string_body, without_line_numbers
from exo.worker.engines.mlx.generator.prompt_lookup import PromptLookup

FILE = 'def greet(name):\n    """Say hello."""\n    print(f"hello {name}")\n    return "done"\n'


def test_read_tool_line_numbers_come_off_in_every_format_agents_use() -> None:
    lines = FILE.splitlines()
    opencode = "\n".join(f"{number}: {line}" for number, line in enumerate(lines, start=1))
    padded = "\n".join(f"{number:05d}| {line}" for number, line in enumerate(lines, start=1))
    cat_n = "\n".join(f"{number:6d}\t{line}" for number, line in enumerate(lines, start=1))
    arrow = "\n".join(f"{number:6d}→{line}" for number, line in enumerate(lines, start=1))
    for shown in (opencode, padded, cat_n, arrow):
        assert without_line_numbers(shown) == FILE.rstrip("\n")
    assert without_line_numbers("plain prose\nwith 2: a number inside\nand more") is None


def test_views_are_the_json_escaped_text_and_the_text_without_line_numbers() -> None:
    numbered = "\n".join(f"{number}: {line}" for number, line in enumerate(FILE.splitlines(), start=1))
    views = copy_views([numbered, "too short", FILE])
    bare = FILE.rstrip("\n")
    assert views == [bare, json_string_body(numbered), json_string_body(bare), json_string_body(FILE)]
    assert json_string_body('a "b"\n') == 'a \\"b\\"\\n'
    assert copy_views(["x" * 100]) == []  # nothing to escape, no numbers: the prompt already holds that form


def test_the_newest_texts_get_views_while_the_budget_lasts() -> None:
    old, new = FILE + "# old\n", FILE + "# new\n"
    assert copy_views([old, new]) == [json_string_body(old), json_string_body(new)]
    assert copy_views([old, new], budget_chars=len(json_string_body(new)) + 10) == [json_string_body(new)]


def test_a_copy_in_progress_follows_the_reference_it_matches_longest() -> None:
    settings = LookupSettings(max_draft_tokens=4, longest_ngram=2, shortest_ngram=2)
    # The text holds 1 2 3 then 7 8 (raw form); the reference holds 5 6 1 2 4 4 (escaped form).
    lookup = PromptLookup([1, 2, 3, 7, 8, 0, 5, 6], settings, references=[[5, 6, 1, 2, 4, 4]])
    assert lookup.propose(4) == [1, 2, 4, 4]  # (5, 6) occurs only in the reference
    lookup.extend([1, 2])
    # (1, 2) occurs in both; the output's 5 6 1 2 agrees with the reference for 4 tokens, with the text for 2.
    assert lookup.propose(4) == [4, 4]
    other = PromptLookup([9, 1, 2, 3, 0, 9, 1], settings, references=[[5, 1, 2, 4]])
    other.extend([2])
    assert other.propose(4) == [3, 0, 9, 1]  # 9 1 2 agrees with the text longer: the text's continuation wins

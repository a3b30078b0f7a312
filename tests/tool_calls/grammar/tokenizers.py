"""Small byte-level BPE tokenizers per format, with the format's markers as added tokens or as plain text, viewed
by llguidance: what a grammar is checked against, without loading any model."""

import string
from functools import lru_cache

import llguidance
import llguidance.hf
from llguidance import LLMatcher, LLTokenizer
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.request_grammar import format_grammar

END_OF_TURN = "<|end_of_turn|>"
# Harmony's turn ends on these (GPT-OSS lists them as end-of-sequence tokens).
_HARMONY_STOPS = ("<|call|>", "<|return|>")
_CORPUS = [
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "The quick brown fox jumps over the lazy dog. It is sunny in Paris today.",
    string.ascii_letters + string.digits + string.punctuation + " \n\t",
]


class FormatTokenizer:
    def __init__(self, tool_format: ToolFormatName, markers_are_tokens: bool) -> None:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[END_OF_TURN],
            show_progress=False,
        )
        tokenizer.train_from_iterator(_CORPUS * 20, trainer)
        stops = _HARMONY_STOPS if tool_format is ToolFormatName.HARMONY else ()
        markers = (*format_grammar(tool_format).marker_texts, *stops) if markers_are_tokens else stops
        tokenizer.add_special_tokens([AddedToken(marker, special=True) for marker in markers])
        self.fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TURN)
        eos = [self._id(token) for token in (END_OF_TURN, *stops)]
        self.lltokenizer: LLTokenizer = llguidance.hf.from_tokenizer(self.fast, eos_token=eos)
        self.special_tokens = {marker: self._id(marker) for marker in markers}

    def _id(self, token: str) -> int:
        token_id = self.fast.convert_tokens_to_ids(token)
        assert isinstance(token_id, int)
        return token_id

    def accepts(self, grammar: str, reply: str) -> bool:
        """Whether the whole reply, tokenized as a model with this tokenizer would write it, completes the grammar."""
        matcher = LLMatcher(self.lltokenizer, llguidance.grammar_from("lark", grammar), log_level=0)
        tokens: list[int] = self.fast.encode(reply, add_special_tokens=False)
        return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


@lru_cache(maxsize=64)
def format_tokenizer(tool_format: ToolFormatName, markers_are_tokens: bool) -> FormatTokenizer:
    return FormatTokenizer(tool_format, markers_are_tokens)

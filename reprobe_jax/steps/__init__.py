"""What a step is (docs/method.md, Steps): the character-level definition of each mode, the byte model of a
tokenizer's vocabulary, the automaton that the sampler's stop rule and the host alignment both run, and the label
encoding."""

from reprobe_jax.steps.segment import (ABBREVIATIONS, HEADER_WORDS, MODES, SENTENCE_ENDS, THINK_CLOSE, THINK_OPEN,
                                       WHITESPACE, Step, TokenBytes, align, byte_ends, char_offsets, check_text,
                                       line_regions, paragraph_regions, regex_literals, regex_regions, segment,
                                       sentence_regions, token_bytes, token_end_offsets, token_ids)
from reprobe_jax.steps.boundary import ENDS_AFTER, ENDS_BEFORE, StepBoundary, StopTable, advance, initial_state
from reprobe_jax.steps.labels import labels_from_json, labels_to_json

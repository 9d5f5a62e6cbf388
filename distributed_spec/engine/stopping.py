"""When a row finishes: EOS id, budget (max_new_tokens clipped to the context) or a stop string.

    from distributed_spec.engine.stopping import StopChecker, prompt_budgets
    reason = StopChecker(eos_token_ids, stop_strings, tokenizer).append(output, new_tokens, budget)

Stop strings are matched incrementally: only the text of the tokens around the new ones is decoded
(a window as long, in tokens, as the longest stop string in characters, plus a margin), so a row's
cost per step does not grow with its length.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Tokens decoded before the new ones besides the longest stop string's length: a stop string may
# start inside a token that decodes together with the one before it.
STOP_WINDOW_MARGIN = 2


class StopChecker:
    """Appends a step's tokens to a row's output and says whether (and why) the row finished."""

    def __init__(self, eos_token_ids: tuple[int, ...], stop_strings: tuple[str, ...], tokenizer=None) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.tokenizer = tokenizer
        # Every token decodes to at least one character, or to nothing (then it cannot hold a stop).
        self.window = max((len(stop) for stop in self.stop_strings), default=0) + STOP_WINDOW_MARGIN

    def append(self, output: list[int], new_tokens: list[int], budget: int) -> str | None:
        """Append new_tokens to output in place; return "eos", "length", "stop" or None.

        EOS is kept as the last token; nothing is appended past EOS or the budget; at a stop string
        the output is cut right after the token that completes it.
        """
        start = len(output)
        reason = None
        for token_id in new_tokens:
            output.append(token_id)
            if token_id in self.eos_token_ids:
                reason = "eos"
                break
            if len(output) >= budget:
                reason = "length"
                break
        if self.stop_strings:
            num_kept = self._stop_cut(output, start)
            if num_kept is not None:
                del output[num_kept:]
                return "stop"
        return reason

    def _contains_stop(self, output: list[int], begin: int, end: int) -> bool:
        text = self.tokenizer.decode(output[begin:end])
        return any(stop in text for stop in self.stop_strings)

    def _stop_cut(self, output: list[int], start: int) -> int | None:
        """The shortest prefix length > start whose text contains a stop string, or None."""
        begin = max(0, start - self.window)
        if not self._contains_stop(output, begin, len(output)):
            return None
        for num_kept in range(start + 1, len(output) + 1):
            if self._contains_stop(output, begin, num_kept):
                return num_kept
        return len(output)


def prompt_budgets(
    prompts: list[list[int]], vocab_size: int, max_context: int | None, max_new_tokens: int | list[int]
) -> list[int]:
    """Validate prompts; return each row's token budget: max_new_tokens (one for all, or one per
    prompt), clipped so that prompt + completion fit the context."""
    budgets = []
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {index} is empty: every prompt needs at least one token id")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {index} has token ids outside [0, {vocab_size}) (the model's vocabulary)")
        budget = max_new_tokens if isinstance(max_new_tokens, int) else max_new_tokens[index]
        if budget < 1:
            raise ValueError(f"prompt {index}: max_new_tokens must be >= 1, got {budget}")
        if max_context is not None:
            if len(prompt) >= max_context:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens, the model context is {max_context}: "
                    "shorten the prompt (or raise model.max_context_len if the model allows it)"
                )
            if len(prompt) + budget > max_context:
                logger.warning(
                    "prompt %d: %d tokens + max_new_tokens=%d exceed the context %d; generating at most %d tokens",
                    index,
                    len(prompt),
                    budget,
                    max_context,
                    max_context - len(prompt),
                )
                budget = max_context - len(prompt)
        budgets.append(budget)
    return budgets

"""Which `generate()` keyword arguments AMDModelForCausalLM honours, accepts as no-ops, or refuses.

transformers raises on an argument it does not know (a typo such as `max_new_token=2`); so do we.
An argument transformers knows but this path does not implement (beams, `typical_p`, logits
processors, `output_attentions`, ...) is refused when it would change the result and accepted when
its value is the neutral one (None, False, `num_beams=1`, `typical_p=1.0`, ...), because pipelines and
saved generation configs pass those routinely.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from ..errors import InvalidArgumentError

SUPPORTED = frozenset({
    "max_new_tokens", "max_length", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p",
    "repetition_penalty", "eos_token_id", "stop_token_ids", "pad_token_id",
})
"""Read by `AMDModelForCausalLM.sampling_params` / `generate`."""

NO_EFFECT = frozenset({
    "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile",
    "low_memory", "prefill_chunk_size", "bos_token_id", "decoder_start_token_id", "early_stopping",
    "length_penalty", "tokenizer", "synced_gpus", "continuous_batching_config", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "max_matching_ngram_size", "assistant_ensemble_weight",
    "transformers_version", "_from_model_config", "return_legacy_cache",
})
"""Accepted with any value: they tune caching, compilation or modes that are off here, never the tokens."""

NEUTRAL: Mapping[str, Any] = {
    "num_beams": 1, "num_return_sequences": 1, "num_beam_groups": 1, "typical_p": 1.0, "min_p": 0.0,
    "encoder_repetition_penalty": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0,
    "guidance_scale": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0,
    "penalty_alpha": 0.0,
}
"""Values of refused arguments that mean "off" (None, False and empty containers are off for all)."""

REFUSED = frozenset(NEUTRAL) | frozenset({
    "max_time", "stop_strings", "top_h", "bad_words_ids", "renormalize_logits", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "sequence_bias", "token_healing", "watermarking_config", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "prompt_lookup_num_tokens",
    "assistant_early_exit", "speculation_type", "use_mtp", "dola_layers", "constraints", "force_words_ids",
    "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model", "assistant_tokenizer",
    "negative_prompt_ids", "negative_prompt_attention_mask", "custom_generate", "past_key_values", "inputs_embeds",
    "position_ids", "cache_position", "token_type_ids",
})
"""Arguments that change the output and that this path does not implement."""


def is_neutral(name: str, value: Any) -> bool:
    """True when `value` leaves `name` switched off."""
    if value is None or value is False:
        return True
    if isinstance(value, (list, tuple, dict, set)) and not value:
        return True
    neutral = NEUTRAL.get(name)
    return neutral is not None and not isinstance(value, bool) and value == neutral


def refused_settings(values: Mapping[str, Any]) -> list[str]:
    """`name=value` for each refused argument in `values` that is not at its neutral value."""
    return [f"{k}={values[k]!r}" for k in sorted(values) if k in REFUSED and not is_neutral(k, values[k])]


def check_generate_kwargs(kwargs: Mapping[str, Any], generation_config: Any = None) -> None:
    """Raise `InvalidArgumentError` for unknown arguments (with a suggestion) and for refused ones."""
    known = SUPPORTED | NO_EFFECT | REFUSED
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(SUPPORTED | NO_EFFECT | REFUSED), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InvalidArgumentError(
            f"generate() got unknown arguments: {', '.join(hints)}. Supported: {', '.join(sorted(SUPPORTED))}, "
            "attention_mask, generation_config, streamer."
        )
    refused = refused_settings(kwargs)
    if generation_config is not None:
        refused += [f"generation_config.{s}" for s in refused_settings(
            {k: getattr(generation_config, k, None) for k in REFUSED})]
    if refused:
        raise InvalidArgumentError(
            f"AMDModelForCausalLM.generate does not support {', '.join(refused)}. Drop them, or use the "
            "transformers model (model.model.generate) for these features."
        )

"""The engines' EAGLE-3 layer-id conventions: which target layers' hidden states an engine feeds a drafter for the
`eagle_aux_hidden_state_layer_ids` in its config. Pure rules, read from the engines' model code; doctor's aux-layers
check asks the installed engine itself (engines/probe.py), `speclock stack new` applies them before any engine exists.

Layers are counted as "after k decoder layers" (transformers' hidden_states[k]), the drafter manifest's aux_layers_after.
"""

from __future__ import annotations


def default_ids(num_target_layers: int) -> list[int]:
    """The ids both engines use when the drafter's config names none: vLLM's default and SGLang's Llama default."""
    n = num_target_layers
    return [2, n // 2, n - 3]


def sglang_after_layers(aux_ids: list[int], target_arch: str) -> list[int]:
    """Layers SGLang captures for a drafter's aux ids: +1 for Llama/Qwen-style targets; for
    DeepseekV2/V3 only when ids[0] == 1 (sglang 0.5.23 model code)."""
    if target_arch.startswith(("DeepseekV2", "DeepseekV3")):
        return [i + 1 for i in aux_ids] if aux_ids and aux_ids[0] == 1 else list(aux_ids)
    return [i + 1 for i in aux_ids]


def after_layers(engine: str, aux_ids: list[int] | None, target_arch: str, num_target_layers: int) -> tuple[list[int], str]:
    """(layers the engine feeds the drafter, the rule that said so) for `engine` ('vllm' or 'sglang')."""
    if not aux_ids:
        return default_ids(num_target_layers), f"{engine}'s default (2, N//2, N-3): the drafter config names no ids"
    if engine == "sglang":
        return sglang_after_layers(aux_ids, target_arch), "SGLang: layers_to_capture = id + 1 (the input of layer id + 1)"
    return list(aux_ids), "vLLM: id i = the hidden state entering layer i = after i layers"


def ids_for(engine: str, after: list[int], target_arch: str) -> list[int]:
    """The config ids that make `engine` feed the layers `after` (the inverse of after_layers)."""
    if engine == "sglang" and not (target_arch.startswith(("DeepseekV2", "DeepseekV3")) and after and after[0] != 2):
        return [i - 1 for i in after]
    return list(after)

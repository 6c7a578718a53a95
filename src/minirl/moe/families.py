"""Per-family router specs for routing replay (transformers 5.24 router classes).

Every supported router module returns a tuple whose item ``weights_pos`` is the per-token gate
weights [N, K] and item ``index_pos`` the selected experts [N, K] (N = B*T flattened rows); the MoE
block passes both straight to its experts module. Replay keeps the router's own output structure
and substitutes only those two items: the forced indices, and weights recomputed from the live
router output at the forced indices with *that family's own* scoring. Each scoring function below
mirrors the family's router ``forward`` op for op (same dtype casts, same renormalisation, same
scaling), so replaying the indices a router picked by itself reproduces its output bit for bit
(the unit tests check this per family) and gradients reach the router through the recomputed
weights exactly as they do without replay.

A scoring function takes ``(router, hidden, out, idx)``: the router module, the hidden states it
was called with, its natural output tuple (``out[0]`` is the router logits, or the router
probabilities for Gemma-4), and the long [N, K] indices to weight. It returns the weights with the
natural weights' dtype.

One family's router returns no indices: Llama-4's returns dense scores [N, E] (the selected experts'
sigmoid, 0 elsewhere) and its logits, and every expert runs on every token scaled by its score. Its
spec has ``index_pos`` None and an ``indices`` function that reads the selection off the output (the
top-k of the logits, the forward's own call); its scoring function returns the dense scores.

Adding a family: read its router ``forward`` and the MoE block that consumes it, check that the
block hands the router's indices and weights to its experts unchanged, write (or reuse) a scoring
function, add the router class name to ``ROUTERS``, and add the family to the unit tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Scorer = Callable[[nn.Module, torch.Tensor, tuple, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RouterSpec:
    family: str  # a transformers model_type that uses this router
    scoring: str  # short description of how the gate weights are computed
    score: Scorer
    weights_pos: int = 1
    index_pos: int | None = 2  # None: the output holds no indices (``indices`` reads them off it)
    experts_attr: str = "num_experts"  # dotted path on the router module
    top_k_attr: str = "top_k"
    indices: Callable[[nn.Module, tuple], torch.Tensor] | None = None  # (router, out) -> [N, K], index_pos None

    def natural_indices(self, router: nn.Module, out: tuple) -> torch.Tensor:
        """The experts [N, K] the router chose by itself in the call that returned ``out``."""
        if self.index_pos is None:
            assert self.indices is not None, f"{self.family}: a router spec without index_pos needs indices"
            return self.indices(router, out)
        return out[self.index_pos]

    def num_experts(self, router: nn.Module) -> int:
        return int(_getpath(router, self.experts_attr))

    def top_k(self, router: nn.Module) -> int:
        return int(_getpath(router, self.top_k_attr))


def _getpath(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------------------------------
# Scoring functions, one per distinct router formula.


def _renorm(w: torch.Tensor) -> torch.Tensor:
    return w / w.sum(dim=-1, keepdim=True)


def score_qwen(router, hidden, out, idx):
    """Qwen3-MoE / Qwen2-MoE / OLMoE / FlexOlmo / Qwen3-Next / Mellum: softmax over all experts in
    fp32, take the selected, renormalise iff ``norm_topk_prob``, cast to the logits dtype."""
    logits = out[0]
    w = F.softmax(logits, dtype=torch.float, dim=-1).gather(1, idx)
    if router.norm_topk_prob:
        w = _renorm(w)
    return w.to(logits.dtype)


def score_qwen_always_norm(router, hidden, out, idx):
    """Qwen3.5-MoE / Qwen3-VL-MoE text / HunYuan-V1-MoE: as ``score_qwen`` but always renormalised."""
    logits = out[0]
    w = _renorm(F.softmax(logits, dtype=torch.float, dim=-1).gather(1, idx))
    return w.to(logits.dtype)


def score_mixtral(router, hidden, out, idx):
    """Mixtral / MiniMax: softmax in fp32, selected, renormalised (= softmax over the top-k logits),
    left in fp32."""
    logits = out[0]
    return _renorm(F.softmax(logits.float(), dim=-1).gather(1, idx))


def score_jamba(router, hidden, out, idx):
    """Jamba: softmax in fp32, selected, *not* renormalised, cast to the hidden dtype."""
    logits = out[0]
    return F.softmax(logits, dim=-1, dtype=torch.float).gather(1, idx).to(hidden.dtype)


def score_lara_mini(router, hidden, out, idx):
    """LaraMini: fp32 logits, softmax, selected, optional renormalisation, hidden dtype."""
    w = F.softmax(out[0], dim=-1).gather(1, idx)
    if router.norm_topk_prob:
        w = _renorm(w)
    return w.to(hidden.dtype)


def score_ernie(router, hidden, out, idx):
    """Ernie-4.5-MoE: softmax in fp32 (selection uses bias-corrected probs, the weights do not),
    renormalised with the sum clamped at ``norm_min``, cast to the hidden dtype."""
    w = F.softmax(out[0], dim=1, dtype=torch.float).gather(-1, idx)
    w = w / torch.clamp(w.sum(dim=-1, keepdim=True), min=router.norm_min)
    return w.to(hidden.dtype)


def score_deepseek_v3(router, hidden, out, idx):
    """DeepSeek-V3 style (also GLM-4-MoE, dots1, EXAONE-MoE, Solar-Open, MiMo-V2-Flash, ...):
    sigmoid of the fp32 logits; the bias correction and group limit only steer the *selection*;
    selected sigmoid scores, renormalised (+1e-20) iff ``norm_topk_prob``, times
    ``routed_scaling_factor``."""
    w = out[0].sigmoid().gather(1, idx)
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


def score_deepseek_v2(router, hidden, out, idx):
    """DeepSeek-V2: softmax of the fp32 logits, selected (greedy or group-limited selection),
    times ``routed_scaling_factor``, no renormalisation."""
    w = out[0].softmax(dim=-1, dtype=torch.float32).gather(1, idx)
    return w * router.routed_scaling_factor


def score_minimax_m2(router, hidden, out, idx):
    """MiniMax-M2: sigmoid in fp32 (bias only steers selection), selected, renormalised."""
    return _renorm(torch.sigmoid(out[0].float()).gather(1, idx))


def score_hy_v3(router, hidden, out, idx):
    """HY-V3: sigmoid of fp32 logits, selected, renormalised (+1e-20), times ``router_scaling_factor``."""
    w = torch.sigmoid(out[0]).gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.router_scaling_factor


def score_laguna(router, hidden, out, idx):
    """Laguna: sigmoid of the (soft-capped) fp32 logits, selected, renormalised, hidden dtype."""
    w = _renorm(torch.sigmoid(out[0]).gather(-1, idx))
    return w.to(hidden.dtype)


def score_kolibri(router, hidden, out, idx):
    """Kolibri-1: sigmoid of the selected fp32 logits, renormalised iff ``norm_topk_prob``."""
    w = out[0].gather(1, idx).sigmoid()
    if router.norm_topk_prob:
        w = _renorm(w)
    return w


def score_afmoe(router, hidden, out, idx):
    """AFMoE: sigmoid of fp32 logits, selected, renormalised (+1e-20), times ``route_scale``."""
    w = torch.sigmoid(out[0]).gather(dim=1, index=idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.route_scale


def score_lfm2(router, hidden, out, idx):
    """LFM2-MoE: sigmoid, selected, renormalised (+1e-6) iff ``norm_topk_prob``, times
    ``routed_scaling_factor``."""
    logits = out[0]
    w = logits.sigmoid().gather(1, idx)
    if router.use_expert_bias:
        w = w.type_as(logits)
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-6)
    return w * router.routed_scaling_factor


def score_topk_logits_softmax(router, hidden, out, idx):
    """GPT-OSS: softmax over the selected logits, in the logits dtype."""
    top = out[0].gather(1, idx)
    return F.softmax(top, dim=1, dtype=top.dtype)


def score_granite(router, hidden, out, idx):
    """Granite-MoE (plain, shared, SWA, hybrid): softmax over the selected fp32 logits, cast to the
    hidden dtype."""
    return torch.softmax(out[0].gather(1, idx), dim=-1).type_as(hidden)


def score_aria(router, hidden, out, idx):
    """Aria text: softmax over the selected logits."""
    return F.softmax(out[0].gather(1, idx), dim=-1)


def score_cohere2(router, hidden, out, idx):
    """Cohere2-MoE: softmax (fp32) or sigmoid (+ optional renormalisation) of the selected logits,
    cast to the hidden dtype."""
    top = out[0].gather(1, idx)
    if router.expert_selection_fn == "softmax":
        w = F.softmax(top, dim=1, dtype=torch.float)
    else:
        w = F.sigmoid(top)
        if router.norm_topk_prob:
            w = w / torch.sum(w, dim=-1, keepdim=True)
    return w.to(hidden.dtype)


def score_mistral4(router, hidden, out, idx):
    """Mistral-4: softmax of the logits, group-limited top-k, renormalised (+1e-20) iff
    ``norm_topk_prob``, times ``routed_scaling_factor``."""
    w = out[0].softmax(-1).gather(1, idx)
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


def score_beam(router, hidden, out, idx):
    """Beam: sigmoid of fp32 logits, selected, renormalised (+1e-20) iff ``norm_topk_prob``; the
    routed scaling factor is applied by the block after the experts."""
    w = out[0].sigmoid().gather(1, idx)
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w


def score_flint(router, hidden, out, idx):
    """Flint: sigmoid of fp32 logits (no bias), selected, renormalised iff ``norm_topk_prob``."""
    w = out[0].sigmoid().gather(1, idx)
    if router.norm_topk_prob:
        w = _renorm(w)
    return w


def score_fn_bias_renorm(router, hidden, out, idx):
    """DeepSeek-V4 (top-k layers) / Inkling-2: ``score_fn`` (sigmoid, softplus-sqrt, ...) of the
    logits, selected, renormalised (+1e-20), times ``routed_scaling_factor``."""
    w = router.score_fn(out[0]).gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


def llama4_indices(router, out):
    """Llama-4: the top-k of the router logits (``out[1]``), the call its forward makes."""
    return torch.topk(out[1], router.top_k, dim=1).indices


def score_llama4(router, hidden, out, idx):
    """Llama-4: dense scores [N, E]: the selected experts' logits, -inf elsewhere, through a sigmoid in fp32 (so 0
    elsewhere), cast back to the logits dtype."""
    logits = out[1]
    scores = torch.full_like(logits, float("-inf")).scatter_(1, idx, logits.gather(1, idx))
    return torch.sigmoid(scores.float()).to(scores.dtype)


def score_gemma4(router, hidden, out, idx):
    """Gemma-4: ``out[0]`` holds the fp32 router probabilities; selected, renormalised, times the
    learned ``per_expert_scale`` of each selected expert."""
    w = _renorm(out[0].gather(1, idx))
    return w * router.per_expert_scale[idx]


# --------------------------------------------------------------------------------------------------
# Router class name -> spec. Only families covered by tests/unit/test_moe_*.py are listed.

_S = RouterSpec
ROUTERS: dict[str, RouterSpec] = {
    "Qwen3MoeTopKRouter": _S("qwen3_moe", "softmax, top-k, renorm if norm_topk_prob", score_qwen),
    "Qwen2MoeTopKRouter": _S(
        "qwen2_moe", "softmax, top-k, renorm if norm_topk_prob (shared expert outside the router)", score_qwen
    ),
    "OlmoeTopKRouter": _S("olmoe", "softmax, top-k, renorm if norm_topk_prob", score_qwen),
    "FlexOlmoTopKRouter": _S("flex_olmo", "softmax, top-k, renorm if norm_topk_prob", score_qwen),
    "Qwen3NextTopKRouter": _S("qwen3_next", "softmax, top-k, renorm if norm_topk_prob", score_qwen),
    "MellumTopKRouter": _S("mellum", "softmax, top-k, renorm if norm_topk_prob", score_qwen),
    "Qwen3_5MoeTopKRouter": _S("qwen3_5_moe_text", "softmax, top-k, renorm", score_qwen_always_norm),
    "HunYuanMoEV1Gate": _S("hunyuan_v1_moe", "softmax, top-k, renorm", score_qwen_always_norm),
    "MixtralTopKRouter": _S("mixtral", "softmax over the top-k logits", score_mixtral),
    "MiniMaxTopKRouter": _S("minimax", "softmax over the top-k logits", score_mixtral),
    "JambaTopKRouter": _S("jamba", "softmax, top-k, no renorm", score_jamba),
    "LaraMiniTopKRouter": _S("lara_mini", "softmax, top-k, renorm if norm_topk_prob", score_lara_mini),
    "Ernie4_5_MoeTopKRouter": _S("ernie4_5_moe", "softmax, bias-corrected top-k, clamped renorm", score_ernie),
    "DeepseekV3TopkRouter": _S(
        "deepseek_v3", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "Glm4MoeTopkRouter": _S(
        "glm4_moe", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "Dots1TopkRouter": _S(
        "dots1", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "ExaoneMoeTopkRouter": _S(
        "exaone_moe", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "SolarOpenTopkRouter": _S(
        "solar_open", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "MiMoV2FlashTopkRouter": _S(
        "mimo_v2_flash", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "Glm4MoeLiteTopkRouter": _S(
        "glm4_moe_lite", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "KimiLinearTopkRouter": _S(
        "kimi_linear", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "NemotronHTopkRouter": _S(
        "nemotron_h", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "DeepseekV32TopkRouter": _S(
        "deepseek_v32", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "AXK1TopkRouter": _S(
        "axk1", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "AXK2TopkRouter": _S(
        "axk2", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "BailingHybridTopkRouter": _S(
        "bailing_hybrid", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "GlmMoeDsaTopkRouter": _S(
        "glm_moe_dsa", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "HYV4TopkRouter": _S(
        "hy_v4", "sigmoid, bias-corrected group-limited top-k, renorm, routed_scaling_factor", score_deepseek_v3
    ),
    "GraniteMoeHybridTopKRouter": _S("granitemoehybrid", "top-k of logits, softmax over them", score_granite),
    "DeepseekV2TopkRouter": _S("deepseek_v2", "softmax, (group-limited) top-k, routed_scaling_factor", score_deepseek_v2),
    "MiniMaxM2TopKRouter": _S("minimax_m2", "sigmoid, bias-corrected top-k, renorm", score_minimax_m2),
    "HYV3TopKRouter": _S("hy_v3", "sigmoid, bias-corrected top-k, renorm, router_scaling_factor", score_hy_v3),
    "LagunaTopKRouter": _S("laguna", "softcapped sigmoid, bias-corrected top-k, renorm", score_laguna),
    "Kolibri1TopKRouter": _S("kolibri1", "bias-corrected top-k of logits, sigmoid, renorm", score_kolibri),
    "AfmoeTokenChoiceRouter": _S("afmoe", "sigmoid, bias-corrected top-k, renorm, route_scale", score_afmoe),
    "Lfm2MoeTopKRouter": _S("lfm2_moe", "sigmoid, (bias-corrected) top-k, renorm, routed_scaling_factor", score_lfm2),
    "GptOssTopKRouter": _S("gpt_oss", "top-k of logits (with bias), softmax over them", score_topk_logits_softmax),
    "GraniteMoeTopKRouter": _S("granitemoe", "top-k of logits, softmax over them", score_granite),
    "GraniteMoeSharedTopKRouter": _S("granitemoeshared", "top-k of logits, softmax over them", score_granite),
    "GraniteMoeSWATopKRouter": _S("granitemoe_swa", "top-k of logits, softmax over them", score_granite),
    "AriaTextTopKRouter": _S("aria_text", "top-k of logits, softmax over them", score_aria),
    "Cohere2MoeTopKRouter": _S("cohere2_moe", "top-k of logits, softmax or sigmoid over them", score_cohere2),
    "Mistral4TopkRouter": _S(
        "mistral4", "softmax, group-limited top-k, renorm if norm_topk_prob, routed_scaling_factor", score_mistral4
    ),
    "BeamTopKRouter": _S("beam", "sigmoid, bias-corrected group-limited top-k, renorm", score_beam),
    "FlintTopKRouter": _S("flint", "sigmoid, top-k, renorm if norm_topk_prob", score_flint),
    "DeepseekV4TopKRouter": _S(
        "deepseek_v4", "score_fn, bias-corrected top-k, renorm, routed_scaling_factor (top-k layers only)",
        score_fn_bias_renorm,
    ),
    "Llama4Router": _S(
        "llama4_text", "sigmoid of the top-k logits as dense scores (every expert runs, unselected ones at 0)",
        score_llama4, weights_pos=0, index_pos=None, indices=llama4_indices,
    ),
    "Gemma4TextRouter": _S(
        "gemma4_text", "softmax, top-k, renorm, per-expert scale", score_gemma4,
        top_k_attr="config.top_k_experts", experts_attr="config.num_experts",
    ),
}


# Router-like classes found in transformers 5.24 that replay does not handle, and why.
UNSUPPORTED: dict[str, str] = {
    "PhimoeTopKRouter": "phimoe: sparsemixer samples experts (Gumbel) in training mode and its weights depend on "
    "the selection order through threshold masks and a custom gradient estimator",
    "JetMoeTopKGating": "jetmoe: the gate returns dispatch tensors (sorted batch index, expert sizes), not "
    "per-token indices and weights",
    "JetMoeMoA": "jetmoe: mixture-of-attention experts are routed by JetMoeTopKGating (dispatch tensors)",
    "DbrxRouter": "dbrx: the router returns logits only; top-k happens inside the experts block",
    "NllbMoeTop2Router": "nllb_moe: capacity-limited top-2 routing in an encoder-decoder model",
    "DeepseekV4HashRouter": "deepseek_v4: hash-routed layers select experts by token id, not by a router",
    "ZayaRouter": "zaya: the router has an extra skip expert and threads router state between layers",
    "InklingTopkRouter": "inkling: shared-expert gammas are normalised jointly with the routed experts",
}


_ROUTER_LIKE = ("Router", "Gate", "Gating")


def lookup(module: nn.Module) -> tuple[str, RouterSpec | str] | None:
    """(class name, spec) for a supported router, (class name, reason) for a router replay cannot
    drive, None for anything else. Subclasses of a known router class inherit its entry."""
    for klass in type(module).__mro__:
        name = klass.__name__
        if name in ROUTERS:
            return name, ROUTERS[name]
        if name in UNSUPPORTED:
            return name, UNSUPPORTED[name]
    name = type(module).__name__
    if name.endswith(_ROUTER_LIKE) and (hasattr(module, "top_k") or hasattr(module, "num_experts")):
        return name, "unknown router class (not in minirl.moe.families.ROUTERS)"
    return None


def supported_families() -> list[str]:
    return sorted({spec.family for spec in ROUTERS.values()})

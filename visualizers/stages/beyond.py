"""Beyond one device: how this model splits over N devices, and what crosses the wire per token.
Heads are never cut in pieces: tensor parallelism needs N to divide the KV heads, and each KV
head takes its query heads along."""
from __future__ import annotations

from visualizers import i18n
from visualizers._html import esc, fmt_bytes
from visualizers.disagg import disagg_stage_html
from visualizers.parallel import measured_stage_html
from visualizers.stages.facts import Facts, Part, p, said_in


def beyond(f: Facts) -> Part:
    tp = int(f.model.get("tensor_parallel_size") or 1)
    sharded = bool(f.collectives)
    apart = f.first.get("kv.transfer")  # disaggregated (engine/disagg): prefill and decode on two engines
    text = measured_stage_html(f.collectives, f.lang) + (
        disagg_stage_html(apart, (f.finish or {}).get("ttft"), f.lang) if apart else "") \
        + how_to_split(f.model, sharded, f.lang)
    chip = (i18n.ngettext(f.lang, "{n} rank", "{n} ranks", tp) if tp > 1 else
            i18n.gettext(f.lang, "2 engines") if apart else i18n.gettext(f.lang, "one device"))
    # one device: one line in the map (the section's words still say how it would split)
    return Part(text, ("parallel",), esc(chip), skipped=tp <= 1 and not sharded and not apart,
                reached=sharded or bool(apart) or bool(f.finish))


def _smallest_split(count: int) -> int:
    """The smallest number of devices (at least 2) that divides count evenly (count itself when prime)."""
    return next((d for d in range(2, count + 1) if count % d == 0), max(2, count))


def _either(lang: str, options: list[int]) -> str:
    """[2, 4, 8] -> "2, 4 or 8" (Chinese: "2、4 或 8")."""
    words = [str(o) for o in options]
    if len(words) == 1:
        return words[0]
    comma = i18n.gettext(lang, ", ")
    return i18n.gettext(lang, "{some} or {last}", some=comma.join(words[:-1]), last=words[-1])


def _tensor(model: dict, lang: str) -> tuple[str, list[int]]:
    """The tensor-parallel paragraph, and the sizes N that split this model's KV heads."""
    H, KVH = model["num_heads"], model["num_kv_heads"]
    group = H // max(1, KVH)
    splits = [k for k in range(2, KVH + 1) if KVH % k == 0]
    name = "<b>" + esc(i18n.gettext(lang, "Tensor parallel")) + "</b>"
    if splits:
        k = splits[0]
        heads = esc(i18n.ngettext(lang, "{n} query head", "{n} query heads", group))
        text = said_in(lang, "{name}: a head is never cut in pieces, and a query head reads only its own KV head's "
                             "cache, so the {heads} of each KV head must sit on the device that holds it. N devices "
                             "must therefore divide the {kv_heads} KV heads: N = {sizes} for this model. With N = {k} "
                             "each device holds {h_part} of the {h} query heads and {kv_part} of the {kv_heads} KV "
                             "heads per layer (its slice of every weight matrix).", name=name,
                       heads=heads, kv_heads=str(KVH),
                       sizes=_either(lang, splits), k=str(k), h_part=str(H // k), h=str(H), kv_part=str(KVH // k))
        if KVH % 2:
            text = i18n.sentences(lang, text, said_in(lang, "N = 2 does not work: {kv_heads} KV heads do not split in "
                                                            "two.", kv_heads=str(KVH)))
        return text, splits
    if H < 2:
        return said_in(lang, "{name}: with a single attention head only the weight matrices' other dimension can "
                             "split.", name=name), []
    k = _smallest_split(H)  # one KV head (multi-query attention): it cannot be split, only copied
    return said_in(lang, "{name}: this model's {h} query heads share a single KV head, which cannot be split: N "
                         "devices split the query heads (N must divide {h}: with N = {k}, {part} each) and each device "
                         "keeps a copy of the KV head, so its cache is stored N times.", name=name, h=str(H), k=str(k),
                   part=str(H // k)), []


def _how_to_run(model: dict, splits: list[int], lang: str) -> str:
    """The flag that splits it, with a size this engine accepts (never one the words above rule out)."""
    sizes = model.get("split_sizes")
    sizes = [int(s) for s in sizes] if isinstance(sizes, list) else splits
    if not sizes:
        return said_in(lang, "This request ran on one device, and this engine cannot split this model.")
    flag = "<code>--tensor-parallel-size " + str(sizes[0]) + "</code>"
    comma = i18n.gettext(lang, ", ")
    return said_in(lang, "This request ran on one device ({flag} splits it; sizes this engine accepts for it: "
                         "{sizes}).", flag=flag,
                   sizes=comma.join(str(s) for s in sizes))


def _wire(x: float) -> str:
    return "<b>" + esc(fmt_bytes(x)) + "</b>"


def _pipeline(model: dict, lang: str) -> str:
    L, d, b = model["num_layers"], model["hidden_size"], model["dtype_bytes"]
    if L < 2:
        name = "<b>" + esc(i18n.gettext(lang, "Pipeline parallel")) + "</b>"
        return said_in(lang, "{name}: with {layers} layer there is nothing to split between devices.", name=name,
                       layers=str(L))
    first = (L + 1) // 2
    name = "<b>" + esc(i18n.gettext(lang, "Pipeline parallel × 2")) + "</b>"
    return said_in(lang, "{name}: each device runs consecutive layers, {first} and {rest} of {layers} (device 0: "
                         "layers 0…{last0}, device 1: layers {first}…{last}); only the hidden state crosses between "
                         "stages: {d} × {b} B = {bytes} per token per boundary.",
                   name=name, first=str(first),
                   rest=str(L - first), layers=str(L), last0=str(max(0, first - 1)), last=str(L - 1),
                   d=esc(i18n.number(lang, d)), b=str(b), bytes=_wire(d * b))


def _expert(model: dict, sharded: bool, lang: str) -> str:
    d, b = model["hidden_size"], model["dtype_bytes"]
    E, k = int(model.get("num_experts") or 0), int(model.get("top_k") or 0)
    m = _smallest_split(E)
    name = "<b>" + esc(i18n.gettext(lang, "Expert parallel × {m}", m=str(m))) + "</b>"
    text = said_in(lang, "{name}: {part} of {experts} experts per device (whole experts, never halves); each token's "
                         "hidden state goes to its {k} experts and back (all-to-all): up to 2 × {k} × {d} × {b} B = "
                         "{bytes} per token per MoE layer.",
                   name=name, part=str(E // m), experts=str(E), k=str(k), d=esc(i18n.number(lang, d)), b=str(b),
                   bytes=_wire(2 * k * d * b))
    if sharded:
        text = i18n.sentences(lang, text, said_in(
            lang, "This engine instead keeps every token on every rank (attention's all-reduce already put it there) "
                  "and sums the experts' partial outputs in the block's one all-reduce ({d} × {b} B per token).",
            d=esc(i18n.number(lang, d)), b=str(b)))
    return text


def how_to_split(model: dict, sharded: bool = False, lang: str = i18n.DEFAULT) -> str:
    L, d, b = model["num_layers"], model["hidden_size"], model["dtype_bytes"]
    tp, splits = _tensor(model, lang)
    tp = i18n.sentences(lang, tp, said_in(
        lang, "After attention and after the MLP the partial sums are all-reduced: 2 × {layers} layers × {d} values × "
              "{b} B = {bytes} per token, whatever N.", layers=str(L), d=esc(i18n.number(lang, d)), b=str(b),
        bytes=_wire(2 * L * d * b)))
    rows = [tp, _pipeline(model, lang)]
    if model.get("is_moe") and int(model.get("num_experts") or 0) >= 2:
        rows.append(_expert(model, sharded, lang))
    note = i18n.sentences(lang, said_in(lang, "Figures from this model's config."),
                          "" if sharded else _how_to_run(model, splits, lang),
                          said_in(lang, "Pipeline parallelism is not built in this engine."))
    return p(*rows) + f"<p class='tt-note'>{note}</p>"

"""Beyond one device: how this model splits over N devices, and what crosses the wire per token.
Heads are never cut in pieces: tensor parallelism needs N to divide the KV heads, and each KV
head takes its query heads along."""
from __future__ import annotations

from visualizers._html import esc, fmt_bytes
from visualizers.disagg import disagg_stage_html
from visualizers.parallel import measured_stage_html
from visualizers.stages.facts import Facts, Part, p


def beyond(f: Facts) -> Part:
    tp = int(f.model.get("tensor_parallel_size") or 1)
    sharded = bool(f.collectives)
    apart = f.first.get("kv.transfer")  # disaggregated (engine/disagg): prefill and decode on two engines
    text = measured_stage_html(f.collectives) + (disagg_stage_html(apart, (f.finish or {}).get("ttft")) if apart
                                                 else "") + how_to_split(f.model, sharded)
    chip = f"{tp} ranks" if tp > 1 else "2 engines" if apart else "one device"
    # one device: one line in the map (the section's words still say how it would split)
    return Part(text, ("parallel",), chip, skipped=tp <= 1 and not sharded and not apart,
                reached=sharded or bool(apart) or bool(f.finish))


def _smallest_split(count: int) -> int:
    """The smallest number of devices (at least 2) that divides count evenly (count itself when prime)."""
    return next((d for d in range(2, count + 1) if count % d == 0), max(2, count))


def _either(options: list[int]) -> str:
    """[2, 4, 8] -> "2, 4 or 8"."""
    words = [str(o) for o in options]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _tensor(model: dict) -> tuple[str, list[int]]:
    """The tensor-parallel paragraph, and the sizes N that split this model's KV heads."""
    H, KVH = model["num_heads"], model["num_kv_heads"]
    group = H // max(1, KVH)
    splits = [k for k in range(2, KVH + 1) if KVH % k == 0]
    if splits:
        k = splits[0]
        heads = f"{group} query head{'s' if group != 1 else ''}"
        return (f"<b>Tensor parallel</b>: a head is never cut in pieces, and a query head reads only its own KV "
                f"head's cache, so the {heads} of each KV head must sit on the device that holds it. N devices must "
                f"therefore divide the {KVH} KV heads: N = {_either(splits)} for this model. With N = {k} each device "
                f"holds {H // k} of the {H} query heads and {KVH // k} of the {KVH} KV heads per layer (its slice of "
                "every weight matrix)."
                + (f" N = 2 does not work: {KVH} KV heads do not split in two." if KVH % 2 else "")), splits
    if H < 2:
        return ("<b>Tensor parallel</b>: with a single attention head only the weight matrices' other dimension can "
                "split."), []
    k = _smallest_split(H)  # one KV head (multi-query attention): it cannot be split, only copied
    return (f"<b>Tensor parallel</b>: this model's {H} query heads share a single KV head, which cannot be split: N "
            f"devices split the query heads (N must divide {H}: with N = {k}, {H // k} each) and each device keeps a "
            "copy of the KV head, so its cache is stored N times."), []


def _how_to_run(model: dict, splits: list[int]) -> str:
    """The flag that splits it, with a size this engine accepts (never one the words above rule out)."""
    sizes = model.get("split_sizes")
    sizes = [int(s) for s in sizes] if isinstance(sizes, list) else splits
    if not sizes:
        return "This request ran on one device, and this engine cannot split this model."
    return (f"This request ran on one device (<code>--tensor-parallel-size {sizes[0]}</code> splits it; sizes this "
            f"engine accepts for it: {', '.join(str(s) for s in sizes)}).")


def how_to_split(model: dict, sharded: bool = False) -> str:
    L, d, b = model["num_layers"], model["hidden_size"], model["dtype_bytes"]
    tp, splits = _tensor(model)
    tp += (f" After attention and after the MLP the partial sums are all-reduced: 2 × {L} layers × {d:,} values × "
           f"{b} B = <b>{esc(fmt_bytes(2 * L * d * b))}</b> per token, whatever N.")
    first = (L + 1) // 2
    pp = (f"<b>Pipeline parallel × 2</b>: each device runs consecutive layers, {first} and {L - first} of {L} (device "
          f"0: layers 0…{max(0, first - 1)}, device 1: layers {first}…{L - 1}); only the hidden state crosses "
          f"between stages: {d:,} × {b} B = <b>{esc(fmt_bytes(d * b))}</b> per token per boundary."
          if L >= 2 else f"<b>Pipeline parallel</b>: with {L} layer there is nothing to split between devices.")
    rows = [tp, pp]
    if model.get("is_moe"):
        E, k = int(model.get("num_experts") or 0), int(model.get("top_k") or 0)
        if E >= 2:
            m = _smallest_split(E)
            rows.append(f"<b>Expert parallel × {m}</b>: {E // m} of {E} experts per device (whole experts, never "
                        f"halves); each token's hidden state goes to its {k} experts and back (all-to-all): up to "
                        f"2 × {k} × {d:,} × {b} B = <b>{esc(fmt_bytes(2 * k * d * b))}</b> per token per MoE layer."
                        + (" This engine instead keeps every token on every rank (attention's all-reduce already "
                           "put it there) and sums the experts' partial outputs in the block's one all-reduce "
                           f"({d:,} × {b} B per token)." if sharded else ""))
    note = "Figures from this model's config." + ("" if sharded else " " + _how_to_run(model, splits))
    return p(*rows) + f"<p class='tt-note'>{note} Pipeline parallelism is not built in this engine.</p>"

"""The precision experiment's figures and sentences (app/lab/precision.py's result)."""
from __future__ import annotations

from visualizers.lab import bars, esc, layout, _color
from visualizers.lab_verdict import seconds, share


def figures(result: dict) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    mib = [dict(s, metrics={**s["metrics"], "weights_mib": s["metrics"]["weights_bytes"] / 2 ** 20})
           for s in settings]
    return [bars(settings, (("decode_tokens_per_s", "decode", "tokens/s"),), "Decode speed (this machine)"),
            bars(mib, (("weights_mib", "weights in memory", "MiB"),), "Weights in memory"),
            bars(settings, (("agreement", "top-1 agreement with float32", "share"),
                            ("kl_mean", "mean KL from float32", "nats")), "Next-token agreement and KL"),
            kl_per_position(settings)]


def kl_per_position(settings: list[dict]) -> dict:
    """Each position of the fixed text: does the top token match float32's (hover: both ids)."""
    ref = settings[0]["extra"].get("next_token_top", [])
    data = []
    for i, s in enumerate(settings[1:], start=1):
        mine = s["extra"].get("next_token_top", [])
        xs, ys, cd = [], [], []
        for pos, (p, q) in enumerate(zip(ref, mine)):
            if p and q:
                xs.append(pos)
                ys.append(q[0][1] - dict(q).get(p[0][0], q[-1][1]))
                cd.append([p[0][0], q[0][0]])
        data.append({"type": "scatter", "mode": "markers", "name": esc(s["setting"]["label"]), "x": xs, "y": ys,
                     "marker": {"color": _color(i)}, "customdata": cd,
                     "hovertemplate": "position %{x}: float32's top %{customdata[0]}, this top %{customdata[1]}"
                                      "<br>log-prob gap %{y:.4f}<extra>%{fullData.name}</extra>"})
    return {"data": data, "layout": layout("How far float32's top token fell behind, by position",
                                           xaxis={"title": {"text": "position in the fixed text"}},
                                           yaxis={"title": {"text": "log p(own top) − log p(float32's top)"}})}


def sentences(result: dict) -> list[str]:
    by = {s["setting"]["name"]: s for s in result["settings"]}
    f32 = by.get("float32")
    if f32 is None:
        return []
    ref = f32["metrics"]
    out = []
    for name in ("int8", "int4"):
        s = by.get(name)
        m = s["metrics"] if s else None
        if m is None or m.get("agreement") is None:
            continue
        speed = share(s, f32, "decode_tokens_per_s", "decoded at {pct} of float32's speed", "decode speed",
                      lambda v: f"{v:.0f} tokens/s") + "; " + share(
            s, f32, "cpu_s", "the workload used {pct} of float32's CPU time", "CPU time", seconds)
        out.append(f"With {name} weights the model held {m['weights_bytes'] / 2 ** 20:.1f} MiB of weights against "
                   f"{ref['weights_bytes'] / 2 ** 20:.1f} MiB and picked float32's most likely next token at "
                   f"{m['agreement']:.0%} of {m['positions']} positions (mean KL {m['kl_mean']:.2g} nats; counted); "
                   f"timed, {speed}.{_coverage(m)}")
    return out


def _coverage(m: dict) -> str:
    """What the quantized run left float: the MoE experts (never quantized), a float copy."""
    share, copy = m.get("left_float_share") or 0.0, m.get("float_copy_bytes") or 0
    out = ""
    if m.get("num_experts") and share:
        out += (f" Only the linear layers (attention, the router, the LM head) were quantized: the MoE experts, "
                f"{share:.0%} of float32's weight bytes, stayed float32, since the engine quantizes linear layers "
                f"only and has no option for the experts.")
    elif share:
        out += f" {share:.0%} of float32's weight bytes stayed float32 (linear layers the kernels cannot take)."
    if copy:
        out += (f" Beside the codes a float copy of {copy / 2 ** 20:.1f} MiB appeared: the embedding table, which "
                f"read the LM head's float weights in float32.")
    return out

"""The precision experiment's figures and sentences (app/lab/precision.py's result)."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_, gettext
from visualizers.lab import bars, esc, layout, _color
from visualizers.lab_verdict import seconds, share
from visualizers.lab_words import hover, word


def figures(result: dict, lang: str = i18n.DEFAULT) -> list[dict]:
    settings = result["settings"]
    if not settings:
        return []
    mib = [dict(s, metrics={**s["metrics"], "weights_mib": s["metrics"]["weights_bytes"] / 2 ** 20})
           for s in settings]
    return [bars(settings, (("decode_tokens_per_s", N_("decode"), N_("tokens/s")),), N_("Decode speed (this machine)"),
                 lang),
            bars(mib, (("weights_mib", N_("weights in memory"), "MiB"),), N_("Weights in memory"), lang),
            bars(settings, (("agreement", N_("top-1 agreement with float32"), N_("share")),
                            ("kl_mean", N_("mean KL from float32"), "nats")), N_("Next-token agreement and KL"), lang),
            kl_per_position(settings, lang)]


def kl_per_position(settings: list[dict], lang: str = i18n.DEFAULT) -> dict:
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
        data.append({"type": "scatter", "mode": "markers", "name": esc(word(lang, s["setting"]["label"])), "x": xs,
                     "y": ys,
                     "marker": {"color": _color(i)}, "customdata": cd,
                     "hovertemplate": hover(lang, N_("position %{x}: float32's top %{customdata[0]}, this top "
                                                  "%{customdata[1]}<br>log-prob gap %{y:.4f}"
                                                  "<extra>%{fullData.name}</extra>"))})
    return {"data": data, "layout": layout(gettext(lang, "How far float32's top token fell behind, by position"),
                                           xaxis={"title": {"text": gettext(lang, "position in the fixed text")}},
                                           yaxis={"title": {"text": gettext(lang, "log p(own top) − log p(float32's "
                                                                                  "top)")}})}


def sentences(result: dict, lang: str = i18n.DEFAULT) -> list[str]:
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
        speed = share(s, f32, "decode_tokens_per_s", N_("decoded at {pct} of float32's speed"), N_("decode speed"),
                      lambda v: f"{v:.0f} tokens/s", lang) + gettext(lang, "; ") + share(
            s, f32, "cpu_s", N_("the workload used {pct} of float32's CPU time"), N_("CPU time"), seconds, lang)
        out.append(gettext(lang, "With {name} weights the model held {mib} MiB of weights against {f32_mib} MiB and "
                                 "picked float32's most likely next token at {agreement} of {positions} positions "
                                 "(mean KL {kl} nats; counted); timed, {speed}.", name=name,
                           mib=f"{m['weights_bytes'] / 2 ** 20:.1f}", f32_mib=f"{ref['weights_bytes'] / 2 ** 20:.1f}",
                           agreement=f"{m['agreement']:.0%}", positions=m["positions"], kl=f"{m['kl_mean']:.2g}",
                           speed=speed) + _coverage(m, lang))
    return out


def _coverage(m: dict, lang: str = i18n.DEFAULT) -> str:
    """What the quantized run left float: the MoE experts (never quantized), a float copy."""
    share, copy = m.get("left_float_share") or 0.0, m.get("float_copy_bytes") or 0
    out = ""
    if m.get("num_experts") and share:
        out += gettext(lang, " Only the linear layers (attention, the router, the LM head) were quantized: the MoE "
                             "experts, {share} of float32's weight bytes, stayed float32, since the engine quantizes "
                             "linear layers only and has no option for the experts.", share=f"{share:.0%}")
    elif share:
        out += gettext(lang, " {share} of float32's weight bytes stayed float32 (linear layers the kernels cannot "
                             "take).", share=f"{share:.0%}")
    if copy:
        out += gettext(lang, " Beside the codes a float copy of {mib} MiB appeared: the embedding table, which read "
                             "the LM head's float weights in float32.", mib=f"{copy / 2 ** 20:.1f}")
    return out
